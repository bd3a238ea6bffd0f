"""``python -m eval`` as the field's eval CLIs are used: pass^k beside pass@k (unbiased, from n >= k
responses), the ``-n`` (examples) / ``-r`` (rollouts per example) shorthand, and a killed evaluation
that resumes from its cache without regenerating what it had (a real SIGKILL mid-run)."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval import __main__ as cli
from eval.cache import Cache
from eval.harness import EvalConfig
from eval.passk import pass_at_k, pass_at_ks, pass_hat_k, pass_hat_ks
from trainers.common.config import parse_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n, c, k, expected", [(5, 5, 3, 1.0), (5, 2, 3, 0.0), (4, 2, 1, 0.5), (4, 2, 2, 1 / 6),
                                               (4, 3, 2, 0.5), (10, 9, 10, 0.0), (10, 10, 10, 1.0)])
def test_pass_hat_k_by_hand(n, c, k, expected):
    assert pass_hat_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize("n, c", [(6, 0), (6, 1), (6, 3), (6, 5), (6, 6), (7, 4)])
def test_pass_hat_k_and_pass_at_k_are_the_means_over_every_k_subset(n, c):
    """Unbiased: the estimate from n responses is the mean, over every k of them, of "all k correct"
    (pass^k) and of "one of k correct" (pass@k)."""
    verdicts = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(verdicts, k))
        assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        pass_hat_k(n, c, n + 1)


def test_pass_hat_ks_averages_over_problems():
    correct = [[True, True, False, True], [False, False, False, True]]
    assert pass_hat_ks(correct) == pytest.approx({1: (0.75 + 0.25) / 2, 2: 0.25, 3: 0.125, 4: 0.0})
    assert pass_hat_ks(correct)[1] == pass_at_ks(correct)[1]  # one response: both are the correct rate


def test_n_and_r_are_examples_and_rollouts_per_example():
    cfg = parse_config(EvalConfig, ["-n", "20", "-r", "4"])
    assert (cfg.limit, cfg.samples, cfg.temperature) == (20, 4, 1.0)
    assert parse_config(EvalConfig, ["--limit", "20", "--samples", "4"]) == cfg


def test_sampled_evaluation_prints_and_records_pass_at_k_and_pass_hat_k(tiny_model_dir, tmp_path, capsys):
    [summary] = cli.main(["--env", "toy_envs:Echo-v0", "--model", str(tiny_model_dir), "--split", "train", "-n", "3",
                          "-r", "4", "--max-new-tokens", "3", "--out", str(tmp_path / "out"),
                          "--cache", str(tmp_path / "cache")])
    out = capsys.readouterr().out
    assert sorted(summary["pass^k"]) == sorted(summary["pass@k"]) == ["1", "2", "3", "4"]
    for name in ("pass@k", "pass^k"):
        line = next(text for text in out.splitlines() if text.strip().startswith(name))
        assert all(f"k={k}: {summary[name][str(k)]:.4f}" in line for k in range(1, 5)), line
    written = json.loads(Path(summary["file"]).read_text())
    assert written["pass^k"] == summary["pass^k"] and written["n"] == 3 and written["responses"] == 12


def chunk_files(cache: Path) -> list[Path]:
    """The cache's chunk entries (an evaluation's generations, cached as each chunk ends)."""
    found = []
    for path in cache.rglob("*.json"):
        try:
            if "chunk" in json.loads(path.read_text()):
                found.append(path)
        except (OSError, json.JSONDecodeError):
            pass
    return found


def test_a_killed_evaluation_resumes_from_its_cache(tiny_model_dir, tmp_path, monkeypatch):
    """``python -m eval`` is killed (SIGKILL) once some chunks of its generations are cached; run again,
    it reads those, generates only the rest, and writes what an uninterrupted evaluation writes."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Say {i}.", "answer": str(i)}) + "\n"
                            for i in range(24)))
    argv = ["--env", "toy_envs:Echo-v0", "--model", str(tiny_model_dir), "--split", "train", "--data", str(data),
            "-r", "2", "--max-new-tokens", "6", "--batch-size", "1", "--score-workers", "0"]
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "LLM_ENVS_PROGRESS": "lines"}
    first = subprocess.Popen([sys.executable, "-m", "eval", *argv, "--cache", str(cache), "--out", str(tmp_path / "a")],
                             env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not chunk_files(cache) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL, first.stderr.read().decode()[-3000:]
    done_before = len(chunk_files(cache))
    assert 1 <= done_before < 24 and not list((tmp_path / "a").glob("*.summary.json"))

    generated = []
    from trainers.engines import native

    real = native.NativeEngine.generate
    monkeypatch.setattr(native.NativeEngine, "generate",
                        lambda self, prompts, **kw: generated.append(len(prompts)) or real(self, prompts, **kw))
    [resumed] = cli.main([*argv, "--cache", str(cache), "--out", str(tmp_path / "a")])
    assert resumed["cached_rows"] >= 2 * done_before and not resumed["cached"]
    assert sum(generated) == 24 - resumed["cached_rows"] // 2  # only the prompts it did not have
    assert chunk_files(cache) == []  # the split's entry replaced its chunks

    [whole] = cli.main([*argv, "--cache", str(tmp_path / "fresh"), "--out", str(tmp_path / "b")])
    rows = lambda s: [{k: r[k] for k in ("id", "sample", "completion", "reward")}  # noqa: E731
                      for r in map(json.loads, Path(s["file"].replace(".summary.json", ".jsonl")).read_text().splitlines())]
    assert rows(resumed) == rows(whole) and whole["cached_rows"] == 0
    assert (resumed["pass@k"], resumed["pass^k"]) == (whole["pass@k"], whole["pass^k"])


def test_the_cache_can_drop_an_entry(tmp_path):
    cache = Cache(tmp_path)
    cache.put("ab12", {"x": 1})
    cache.delete("ab12")
    cache.delete("ab12")  # already gone: nothing to do
    assert cache.get("ab12") is None
