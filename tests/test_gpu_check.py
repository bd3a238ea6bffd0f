"""benchmarks.gpu_check: without CUDA one line and exit 0; on the CPU (``--device cpu``) the code of
its checks runs on a tiny model, so what a GPU machine will run is exercised here."""

import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the command would run its checks")
def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], capture_output=True, text=True, timeout=120)
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
    assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
