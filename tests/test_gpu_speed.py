"""benchmarks.gpu.speed: without CUDA one line and exit 0; ``--smoke`` runs every row of the table
on the CPU with a tiny model, so the code a lent GPU will run is exercised here (its numbers mean
nothing on a CPU)."""

import re
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import speed as gpu_speed


def test_the_bandwidth_table_knows_the_cards_by_their_cuda_names():
    names = {"NVIDIA H200": 4.8, "NVIDIA H100 80GB HBM3": 3.35, "NVIDIA H100 PCIe": 2.0, "NVIDIA H100 NVL": 3.9,
             "NVIDIA A100-SXM4-80GB": 2.039, "NVIDIA A100 80GB PCIe": 1.935, "NVIDIA A100-PCIE-40GB": 1.555,
             "NVIDIA L40S": 0.864, "NVIDIA L4": 0.3, "NVIDIA A10G": 0.6, "NVIDIA GeForce RTX 4090": 1.008}
    assert {name: gpu_speed.gpu_limits(name)[0] for name in names} == names
    assert gpu_speed.gpu_limits("Some Future GPU") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the command would time it")
def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.speed"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1 and "no CUDA device" in done.stdout


def test_the_smoke_run_writes_every_row_of_the_table(tmp_path, one_thread):
    out = tmp_path / "table.md"
    assert gpu_speed.main(["--smoke", "--bandwidth", "0.05", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("gpu_speed on cpu: memory bandwidth 0.05 TB/s")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    labels = [(r[0].strip("| "), r[2]) for r in rows]
    generation = [(what, engine) for what, engine in labels if what == "generation"]
    assert generation == [("generation", e) for _ in (4, 8)
                          for e in ("hf", "native eager", "native fixed shapes (CPU: no graphs)")]
    assert [what for what, _ in labels[len(generation):]] == [
        "plain generation of the ES rows", "ES iteration, low-rank", "ES iteration, full-rank",
        "GRPO step, shared prefix", "GRPO step, padded, one row per response"]
    for r in rows:  # seconds, tokens/s and the share of the limit, all measured
        assert float(r[4]) > 0 and float(r[5].replace(",", "")) > 0 and re.fullmatch(r"[\d.]+%", r[6]), r
    assert "x plain generation's speed" in rows[len(generation) + 1][7]
    agree = next(line for line in text.splitlines() if line.startswith("fixed-shape = eager native"))
    assert "float32 100% plain, 100% under low-rank members" in agree, agree  # as tests/test_native_static.py
    profile = (tmp_path / "table_profile.txt").read_text()
    assert "## native eager: tiny" in profile and "## native fixed shapes: tiny" in profile and "aten::mm" in profile
    kernels = next(line for line in text.splitlines() if line.startswith("SDPA kernels"))
    assert "attention: sdpa" in kernels and re.search(r"padded: \w.*; shared prefix: \w", kernels), kernels


def test_rows_not_started_within_the_budget_are_written_as_skipped(tmp_path, one_thread):
    out = tmp_path / "table.md"
    assert gpu_speed.main(["--smoke", "--budget", "0.001", "--no-profile", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert len(rows) == 2 * 3 + 3 + 2 and all(" | skipped | " in r for r in rows), rows
    assert all("the --budget of 0.001 s was spent before it started" in r for r in rows)
    assert "SDPA kernels of the GRPO update: skipped" in out.read_text()


def test_the_table_is_on_disk_after_every_row(tmp_path, one_thread, monkeypatch):
    """A command stopped at its limit (a lent GPU's call) still leaves the rows it measured."""
    out, seen = tmp_path / "table.md", []

    def es_rows(*args, **kwargs):
        seen.append(out.read_text())
        return []

    monkeypatch.setattr(gpu_speed, "es_rows", es_rows)
    assert gpu_speed.main(["--smoke", "--no-profile", "--out", str(out)]) == 0
    generation = [line for line in seen[0].splitlines() if line.startswith("| generation |")]
    assert len(generation) == 6 and "(partial: 6 rows after" in seen[0]
    assert "(partial" not in out.read_text() and "s in all" in out.read_text()


def test_a_budget_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        gpu_speed.parse(["--budget", "0"])
    assert "--budget must be a positive number of seconds, not 0" in capsys.readouterr().err
