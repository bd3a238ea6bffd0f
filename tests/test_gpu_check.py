"""benchmarks.gpu.check: without CUDA one line and exit 0; on the CPU (``--device cpu``) the code of
its checks runs on a tiny model, so what a GPU machine will run is exercised here: a skipped check
is counted as skipped, never as passed, and the FSDP check runs on two CPU processes (gloo), where
``--dtype fp32`` must be what the sharded forward passes computed in."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import check as gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the command would run its checks")
def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "gpu_check: no CUDA device here, so there is nothing to check (run it on a machine with a GPU)"]


def test_the_checks_pass_on_the_cpu(tmp_path, one_thread):
    model, tokenizer = gpu_check.build_model("tiny", None, "cpu", torch.float32)
    checks = gpu_check.engine_checks(model, tokenizer, 8)
    checks.append(gpu_check.masters_check("cpu"))
    gpu_check.save_model(model, tokenizer, tmp_path / "model")
    checks += gpu_check.trainer_checks(tmp_path / "model", tmp_path, "cpu", ["hf"])
    checks.append(gpu_check.fsdp_check(tmp_path / "model", tmp_path, "cpu", 1))
    for check in checks:
        print(check.line())
    names = [c.name for c in checks]
    assert "native = hf (fp32 greedy)" in names and "ES lowrank on hf" in names and "PPO" in names
    assert all(c.ok for c in checks if not c.skipped), [c.line() for c in checks if not c.ok and not c.skipped]
    fsdp = checks[-1]  # one GPU: skipped, and counted as skipped
    assert fsdp.skipped and not fsdp.ok and fsdp.line().startswith("SKIP")
    assert gpu_check.tally(checks).startswith(f"{len(checks) - 1} passed, 1 skipped, 0 failed")


def test_the_tally_counts_skips_apart():
    checks = [gpu_check.Check("a", True, ""), gpu_check.Check("b", False, "", skipped=True),
              gpu_check.Check("c", False, "boom")]
    assert gpu_check.tally(checks) == "1 passed, 1 skipped, 1 failed (of 3 checks); failed: c"


def test_fsdp_with_dtype_fp32_computes_in_fp32_and_bf16_in_bf16(tmp_path, monkeypatch):
    """Two CPU processes (gloo, FSDP2): ``--dtype fp32`` matches one process and its linear layers
    computed in fp32 on both ranks (observed); ``--dtype bf16`` is observed in bf16, so the
    observation can tell them apart."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model, tokenizer = gpu_check.build_model("tiny", None, "cpu", torch.float32)
    gpu_check.save_model(model, tokenizer, tmp_path / "model")
    check = gpu_check.fsdp_check(tmp_path / "model", tmp_path, "cpu", 2, "fp32")
    print(check.line())
    assert check.ok and not check.skipped and "computed in float32 on 2 ranks" in check.detail, check.line()
    seen = tmp_path / "bf16-dtypes"
    ok, error = gpu_check.run_trainer(["benchmarks.speed.compute_dtypes", str(seen), "trainers.grpo", "--env", "Conciseness-v0",
                                       "--model", str(tmp_path / "model"), "--max-new-tokens", "8", "--steps", "1",
                                       "--batch-size", "2", "--group-size", "2", "--eval-every", "0", "--eval-limit",
                                       "2", "--engine", "native", "--dtype", "bf16", "--device", "cpu", "--out",
                                       str(tmp_path / "bf16")], tmp_path / "bf16.log", processes=2)
    assert ok, error
    for rank in (0, 1):
        linear = json.loads((tmp_path / f"bf16-dtypes.rank{rank}.json").read_text())["linear"]
        assert set(linear) == {"bfloat16"}, linear
