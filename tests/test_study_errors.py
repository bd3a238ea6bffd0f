"""benchmarks.study.errors: the test set's standard errors over distinct prompts (clustered by prompt
text), and round two's rg study re-rendered with them from what it commits."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.study import rerender
from benchmarks.study.errors import TEST_PROMPTS, clustered_se, rows_se
from benchmarks.study.verdicts import Study
from trainers.common.config import ConfigError

RG = Path(__file__).resolve().parents[1] / "docs" / "study-rg-arithmetic-r2"


def test_distinct_prompts_give_the_item_level_sample_error():
    rewards = list(np.random.default_rng(0).random(30))
    item = np.std(rewards, ddof=1) / math.sqrt(len(rewards))
    assert clustered_se(rewards, [f"p{i}" for i in range(30)]) == pytest.approx(item)


def test_a_repeated_prompt_counts_once():
    """Ten prompts, each asked twice with the same (greedy) answer: the same evidence as ten items,
    so the error is the ten items' error, not twenty's (which is 1/sqrt(2) of it and more)."""
    once = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    twice, prompts = once + once, [f"p{i}" for i in range(10)] * 2
    assert clustered_se(twice, prompts) == pytest.approx(clustered_se(once, prompts[:10]))
    naive = np.std(twice, ddof=1) / math.sqrt(20)
    assert clustered_se(twice, prompts) > 1.35 * naive
    assert clustered_se([1.0, 0.0], ["p", "p"]) == 0.0 and clustered_se([], []) == 0.0


def test_an_item_outside_the_studys_test_prompts_is_a_clear_error():
    with pytest.raises(ConfigError, match="'x-9' is not in the study's evals/test_prompts.json"):
        rows_se([{"id": "x-9", "reward": 1.0}], {"x-1": "abc"})


@pytest.mark.skipif(not (RG / TEST_PROMPTS).is_file(), reason="round two's rg study is not in this checkout")
def test_round_twos_rg_study_low_rank_es_did_not_learn_counted_over_distinct_prompts():
    """The issue's check: low-rank ES's gain (0.1054) clears twice the item-level standard error
    (0.0997) but not twice the error over the 82 distinct prompts of the 100 test items (0.110-0.123)."""
    groups = json.loads((RG / TEST_PROMPTS).read_text())
    assert (groups["items"], groups["prompts"]) == (100, 82)
    s = Study(RG, json.loads((RG / "results.json").read_text()))
    base = s.results["base"]["greedy"]
    assert s.gain("es_lowrank") == pytest.approx(0.1054, abs=5e-5)
    assert 2 * base["reward_std"] / math.sqrt(base["n"]) == pytest.approx(0.0997, abs=5e-5)
    assert 0.110 <= 2 * s.test_se("es_lowrank") <= 0.123 + 5e-4
    assert not s.learned("es_lowrank") and s.learned("grpo")


@pytest.mark.skipif(not (RG / TEST_PROMPTS).is_file(), reason="round two's rg study is not in this checkout")
def test_the_errors_are_recomputed_from_the_committed_completions(tmp_path):
    """A study measured before the errors were recorded: re-rendering computes them from its committed
    completions and evals/test_prompts.json alone (no env), to the numbers results.json holds."""
    out = tmp_path / "rg"
    shutil.copytree(RG, out)
    results = json.loads((out / "results.json").read_text())
    committed = [r["greedy"]["reward_se"] for r in results["runs"]]
    for summary in [*results["base"].values(), *(r[k] for r in results["runs"] for k in ("greedy", "kl"))]:
        summary.pop("reward_se")
    (out / "results.json").write_text(json.dumps(results))
    rerender.main([str(out)])
    again = json.loads((out / "results.json").read_text())
    assert [r["greedy"]["reward_se"] for r in again["runs"]] == pytest.approx(committed)
    assert (out / "table1.md").read_text() == (RG / "table1.md").read_text()
