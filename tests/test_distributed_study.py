"""benchmarks.study under torchrun (2 processes of one thread, gloo): every run (and every learning
curve segment) trains on both processes, process 0 measures and reports, and the results equal one
process's: ES bit for bit, RL within float rounding."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.study import driver as study

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def study_argv(out, model_dir) -> list[str]:
    """One seed, 32 responses per run: ES 4 members x 2 prompts x 4 iterations (2 members per
    process), low-rank ES 8 x 2 x 2, GRPO and PPO 2 prompts x 4 responses x 4 steps (a prompt per
    process)."""
    return ["--env", "toy_envs:Letter-v0", "--seeds", "1", "--max-samples", "32", "--model", str(model_dir),
            "--out", str(out), "--methods", "es_full,es_lowrank,grpo,ppo", "--population", "4",
            "--lowrank-population", "8", "--group-size", "4", "--batch-size", "2", "--sigmas", "0.05",
            "--betas", "0", "--lrs", "1e-3", "--kl-samples", "2"]


def runs_by_method(out: Path) -> dict[str, dict]:
    return {r["method"]: r for r in json.loads((out / "results.json").read_text())["runs"]}


def numbers(record: dict) -> dict:
    """A record's measured numbers: without where its files are and how long it took."""
    return {k: v for k, v in record.items() if k not in ("file", "seconds", "cpu_seconds")}


def on_two_processes(argv: list[str], logs: Path) -> None:
    """``benchmarks.study argv`` under torchrun, 2 processes of one thread; each rank's output in
    ``logs``, the tail of their stderr in the failure's message."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1",
           "LLM_ENVS_DIST_TIMEOUT": "120"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--log-dir", str(logs), "--redirects", "3", "-m", "benchmarks.study", *argv],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    stderr = "\n".join(p.read_text()[-2000:] for p in sorted(logs.glob("**/stderr.log")))
    assert done.returncode == 0, stderr


def test_a_study_on_two_processes_gives_one_process_results(tmp_path, tiny_model_dir):
    two, one = tmp_path / "two", tmp_path / "one"
    on_two_processes(study_argv(two, tiny_model_dir), tmp_path / "logs")
    study.main(study_argv(one, tiny_model_dir))

    a, b = runs_by_method(one), runs_by_method(two)
    assert set(a) == set(b) == {"es_full", "es_lowrank", "grpo", "ppo"}
    for method in ("es_full", "es_lowrank"):  # every number, bit for bit
        updates = [json.loads(line) for line in (Path(b[method]["run"]) / "updates.jsonl").read_text().splitlines()]
        assert not all(u["skipped"] for u in updates), "ES never updated: the equality would prove nothing"
        for key in ("validation", "greedy", "kl"):
            assert numbers(a[method][key]) == numbers(b[method][key]), (method, key)
    for method in ("grpo", "ppo"):  # the updates agree within float rounding (the sums run in another order)
        for key, metric in (("validation", "eval_reward"), ("greedy", "reward_mean"), ("kl", "kl_mean")):
            assert a[method][key][metric] == pytest.approx(b[method][key][metric], rel=1e-4, abs=1e-6), (method, key)
        assert a[method]["greedy"]["pass@1"] == b[method]["greedy"]["pass@1"]
    # the report is process 0's alone, written once
    assert (two / "table1.md").read_text().count("| GRPO |") == 1


def test_learning_curves_on_two_processes_give_one_process_points(tmp_path, tiny_model_dir):
    """``--curve-budgets`` under torchrun: both processes train every curve segment, process 0
    measures it; the points equal one process's (ES bit for bit, GRPO within float rounding)."""
    argv = lambda out: [*study_argv(out, tiny_model_dir), "--methods", "es_full,grpo", "--curve-budgets", "64"]
    two, one = tmp_path / "two", tmp_path / "one"
    on_two_processes(argv(two), tmp_path / "logs")
    study.main(argv(one))

    def points(out):
        return {(p["method"], p["budget"]): p for p in json.loads((out / "curves.json").read_text())["points"]}

    a, b = points(one), points(two)
    assert set(a) == set(b) == {(m, n) for m in ("es_full", "grpo") for n in (32, 64)}
    assert b[("es_full", 64)]["validation"]["samples"] == 64
    for key, p in a.items():
        if key[0] == "es_full":
            assert numbers(p["validation"]) == numbers(b[key]["validation"]) and numbers(p["greedy"]) == numbers(b[key]["greedy"]), key
        else:
            assert p["greedy"]["reward_mean"] == pytest.approx(b[key]["greedy"]["reward_mean"], rel=1e-4, abs=1e-6), key
    assert (two / "learning_curve.md").read_text().count("| GRPO |") == 2 + 2  # written once, by process 0: scores, costs
