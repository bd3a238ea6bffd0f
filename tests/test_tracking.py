"""Experiment tracking (``trainers/common/tracking.py``): ``--report-to`` values and one-line errors,
one metric vocabulary for ES and RL, and what a W&B offline run and a local Trackio run wrote, read
back from their own files (each test skips where its package, the ``tracking`` extra, is absent)."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.common import tracking
from trainers.es import train as es
from trainers.rl import grpo

ROOT = Path(__file__).resolve().parents[1]
#: What every method's tracked numbers hold, whatever its log.jsonl calls them.
SHARED = {"train/reward", "train/pass@1", "perf/seconds_per_step", "perf/tokens_per_second", "perf/peak_memory_gb",
          "train/samples"}


def tiny_es(model_dir, out, *extra):
    return ["--env", "Conciseness-v0", "--model", str(model_dir), "--out", str(out), "--iterations", "2",
            "--population", "4", "--sigma", "0.05", "--alpha", "0.02", "--max-new-tokens", "4", "--eval-every", "1",
            *extra]


@pytest.mark.parametrize("value, backends", [(None, ["tensorboard"]), ("none", []), ("wandb", ["wandb"]),
                                             ("wandb, trackio", ["wandb", "trackio"]),
                                             ("tensorboard,wandb,wandb", ["tensorboard", "wandb"])])
def test_report_to_values(value, backends):
    assert tracking.parse_report_to(value) == backends


@pytest.mark.parametrize("argv, message", [
    (["--report-to", "mlflow"], "--report-to: mlflow is not one of tensorboard, wandb, trackio, none"),
    (["--report-to", "none,wandb"], "--report-to: none cannot be combined with wandb"),
])
def test_a_bad_report_to_is_one_line(argv, message, tmp_path, capsys):
    for main in (es.main, grpo.main):
        with pytest.raises(SystemExit):
            main([*argv, "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_a_missing_backend_names_the_extra(tmp_path, capsys, monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "trackio" else real(name))
    with pytest.raises(SystemExit):
        es.main(["--report-to", "tensorboard,trackio", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the trackio package is not installed; pip install 'llm-envs[tracking]'" in err[0]
    assert not (tmp_path / "run").exists()


def test_es_and_rl_records_share_one_vocabulary():
    es_record = {"iteration": 3, "reward_mean": -5.0, "reward_std": 1.0, "accuracy": 0.5, "skipped": False,
                 "seconds": 2.0, "cpu_seconds": 3.0, "tokens": 400, "tokens_iteration": 100, "samples": 16}
    rl_record = {"iteration": 3, "reward_mean": -4.0, "accuracy": 0.25, "response_length": 6.0, "loss": 0.1,
                 "kl": 0.02, "seconds": 4.0, "sampling_seconds": 1.0, "samples": 48, "tokens": 600}
    es_numbers, rl_numbers = tracking.metrics(es_record), tracking.metrics(rl_record, previous_tokens=400)
    assert SHARED - {"perf/peak_memory_gb"} <= es_numbers.keys() & rl_numbers.keys()
    assert es_numbers["perf/tokens_per_second"] == 50.0 and rl_numbers["perf/tokens_per_second"] == 50.0
    assert (es_numbers["train/reward"], rl_numbers["train/pass@1"], rl_numbers["train/kl"]) == (-5.0, 0.25, 0.02)
    assert "train/skipped" not in es_numbers and "train/iteration" not in es_numbers  # flags and the step itself
    assert tracking.metrics({"iteration": 0, "eval_pass@1": 0.5, "eval_reward": 1.0}) == {"eval/pass@1": 0.5,
                                                                                       "eval/reward": 1.0}


# ----- reading what the backends wrote ----------------------------------------------------------------


def wandb_records(run_dir: Path):
    """The records of the one offline W&B run under ``run_dir``, parsed from its ``.wandb`` file:
    W&B's record log (a 7-byte header, then 32 KiB blocks of chunks: checksum, length, type; a
    record split over blocks comes as first, middle(s), last), each record a protobuf."""
    from wandb.proto import wandb_internal_pb2

    [path] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, buf = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        buf = chunk if kind in (1, 2) else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            yield record


def test_wandb_offline_run_holds_the_metrics_config_and_group(tiny_model_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no credentials: offline
    run = tmp_path / "run"
    es.main(tiny_es(tiny_model_dir, run, "--report-to", "wandb", "--report-group", "my-study"))
    captured = capsys.readouterr()
    out = captured.out + captured.err
    [files] = run.glob("wandb/offline-run-*")
    assert f"W&B: offline (no W&B credentials found); run files in {files}" in out
    history, config, group = {}, {}, None
    for record in wandb_records(run):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {(i.nested_key[0] if i.nested_key else i.key): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
        elif kind == "run":
            group = record.run.run_group
            config |= {u.key: json.loads(u.value_json) for u in record.run.config.update}
    assert group == "my-study"
    assert config["algorithm"] == "es" and config["population"] == 4 and config["sources"]["population"] == "flag"
    assert config["runtime"]["machine"]["cpu"] and config["runtime"]["dtype"] == "float32"
    assert sorted(history) == [0, 1, 2]
    assert SHARED <= history[1].keys() and {"eval/pass@1", "eval/reward"} <= history[2].keys()
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    trained = [r for r in log if "reward_mean" in r]
    assert [history[r["iteration"]]["train/reward"] for r in trained] == [r["reward_mean"] for r in trained]
    assert json.loads((run / "tracking.json").read_text())["wandb_id"] in files.name


NO_NETWORK = '''
import json, runpy, socket, sys
reached, LOCAL = [], ("127.0.0.1", "::1", "localhost", "0.0.0.0", "", None)
real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOCAL:
        reached.append(str(address))
        raise OSError("no network in this test")
    return real_connect(self, address)
def getaddrinfo(host, *args, **kwargs):  # a name looked up is a request about to be made
    if host not in LOCAL:
        reached.append(str(host))
        raise socket.gaierror("no network in this test")
    return real_lookup(host, *args, **kwargs)
socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
sys.argv = ["trainers.grpo", *sys.argv[1:]]
try:
    runpy.run_module("trainers.grpo", run_name="__main__")
finally:
    open({out!r}, "w").write(json.dumps(reached))
'''


def test_trackio_run_is_local_and_holds_the_metrics(tiny_model_dir, tmp_path):
    """GRPO with --report-to trackio in a process whose sockets refuse any address but this machine's
    (with a Hugging Face token set, a hub request would be tried); the run's numbers are read back
    from Trackio's local files."""
    pytest.importorskip("trackio")
    reached = tmp_path / "reached.json"
    script = tmp_path / "no_network.py"
    script.write_text(NO_NETWORK.format(out=str(reached)))
    run = tmp_path / "run"
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "TRACKIO_PROJECT": "test", "HF_TOKEN": "hf_fake",
           "TRACKIO_SPACE_ID": "someone/space", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "LLM_ENVS_CPU_BF16": "0"}
    argv = ["--env", "toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(run), "--steps", "2",
            "--batch-size", "2", "--group-size", "2", "--eval-every", "1", "--report-to", "trackio",
            "--report-group", "g"]
    result = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(reached.read_text()) == []
    assert f"Trackio: local, project test in {tmp_path / 'trackio'}" in result.stdout + result.stderr
    check = ("from trackio.sqlite_storage import SQLiteStorage as S; import json; [run] = S.get_runs('test'); "
             "print(json.dumps([run, S.get_logs('test', run), S.get_run_config('test', run)]))")
    read = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, env=env)
    assert read.returncode == 0, read.stderr[-3000:]
    name, logs, config = json.loads(read.stdout.splitlines()[-1])
    assert name == str(run) and config["_Group"] == "g" and config["algorithm"] == "grpo"
    steps = {}
    for entry in logs:
        steps.setdefault(entry["step"], {}).update(entry)
    assert sorted(steps) == [0, 1, 2] and SHARED | {"train/kl", "train/loss"} <= steps[1].keys()
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [steps[r["iteration"]]["train/reward"] for r in log if "reward_mean" in r] == \
           [r["reward_mean"] for r in log if "reward_mean" in r]


def test_an_evaluation_is_tracked_with_pass_at_k_and_pass_hat_k(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from eval import __main__ as eval_cli

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    out = tmp_path / "eval"
    [summary] = eval_cli.main(["--env", "toy_envs:Echo-v0", "--model", str(tiny_model_dir), "--split", "train",
                               "-n", "3", "-r", "2", "--max-new-tokens", "3", "--out", str(out), "--cache",
                               str(tmp_path / "cache"), "--report-to", "wandb", "--report-group", "evals"])
    history, config, group = {}, {}, None
    for record in wandb_records(out):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history |= {(i.nested_key[0] if i.nested_key else i.key): json.loads(i.value_json) for i in record.history.item}
        elif kind == "run":
            group, config = record.run.run_group, {u.key: json.loads(u.value_json) for u in record.run.config.update}
    assert group == "evals" and config["samples"] == 2 and config["machine"]["cpu"]
    assert history["eval/pass@1"] == summary["pass@1"] and history["eval/pass^k/2"] == summary["pass^k"]["2"]
    assert {"eval/pass@k/2", "eval/reward", "perf/tokens_per_second", "perf/peak_memory_gb"} <= history.keys()
