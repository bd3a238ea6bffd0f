"""trainers.common.splits: the validation split is carved by distinct prompt text (duplicates move
together, so no validation prompt is trained on), and the test split stays disjoint from train."""

from __future__ import annotations

import json

import pytest

import llm_envs
from trainers.common.config import ConfigError
from trainers.common.splits import VALIDATION, WithValidation, carve, prompt_key, question_key, split_counts

#: rg/basic_arithmetic-v0 with two one-digit terms: ~200 possible questions, so train repeats them.
SMALL_ARITHMETIC = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+", "-"],
                        allow_parentheses=False, allow_negation=False)


def texts(examples) -> set[str]:
    return {prompt_key(e) for e in examples}


def test_no_validation_prompt_is_in_train_on_a_task_that_repeats_its_questions():
    env = llm_envs.make("rg/basic_arithmetic-v0", **SMALL_ARITHMETIC)
    train = env.examples("train")
    assert split_counts(train)["prompts"] < len(train) / 2  # the case at hand: many duplicates
    # the old carve, by index alone, put most validation prompts in train too
    old = set(carve(len(train), 100))
    assert len(texts(e for i, e in enumerate(train) if i in old) & texts(e for i, e in enumerate(train)
                                                                        if i not in old)) > 20
    view = WithValidation(env, 100)
    val, rest = view.examples(VALIDATION), view.examples("train")
    assert not texts(val) & texts(rest)
    assert 90 <= len(val) <= 100 and len(val) + len(rest) == len(train)
    assert split_counts(val)["prompts"] >= 15
    # test against train (and so against validation): no shared question either
    test = env.examples("test")
    assert not texts(test) & texts(train)
    assert not {e.meta["question"] for e in test} & {e.meta["question"] for e in train}


def test_duplicates_move_together_on_a_toy_env(tmp_path):
    rows = [{"question": f"q{i % 7}", "answer": str(i % 7)} for i in range(40)]  # 7 prompts, 5-6 copies each
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = llm_envs.make("toy_envs:Echo-v0", data={"train": str(path)})
    view = WithValidation(env, 12)
    val, rest = view.examples(VALIDATION), view.examples("train")
    assert not texts(val) & texts(rest) and len(val) + len(rest) == 40
    assert 10 <= len(val) <= 12  # two whole prompts of 5-6 copies
    assert split_counts(val) == {"examples": len(val), "prompts": 2}
    with pytest.raises(ConfigError, match="no whole question fits"):
        WithValidation(env, 4)  # every prompt has at least 5 copies


def test_distinct_prompts_keep_the_plain_seeded_carve():
    """Without duplicates the carve is what it always was: runs resumed across the change agree."""
    import numpy as np

    from trainers.common.splits import CARVE_SEED

    keys = [f"p{i}" for i in range(50)]
    expected = sorted(int(i) for i in np.random.default_rng(CARVE_SEED).choice(50, 10, replace=False))
    assert carve(50, 10, keys) == carve(50, 10) == expected


def test_a_hidden_state_env_carves_by_question_not_by_its_one_prompt_text():
    """D7: GuessNumber-v0's examples share one prompt text and differ in their secret; carving by
    prompt text alone could never hold out a whole "prompt" (500 copies), so --val-size failed."""
    env = llm_envs.make("GuessNumber-v0", train_size=60, test_size=5)
    train = env.examples("train")
    assert len(texts(train)) == 1 and len({e.answer for e in train}) > 30
    with pytest.raises(ConfigError, match="no whole prompt fits"):
        WithValidation(env, 10, "prompt")  # the rule before: one prompt, 60 copies
    view = WithValidation(env, 10)
    val, rest = view.examples(VALIDATION), view.examples("train")
    assert 8 <= len(val) <= 10 and len(val) + len(rest) == 60
    assert not {question_key(e) for e in val} & {question_key(e) for e in rest}  # no secret both trained and held out
    assert not {e.answer for e in val} & {e.answer for e in rest}


def test_the_question_carve_equals_the_prompt_carve_where_prompts_determine_answers():
    """Runs carved by prompt text before keep their validation split on every env whose prompt
    fixes its answer (every env but hidden-state ones)."""
    env = llm_envs.make("rg/basic_arithmetic-v0", **SMALL_ARITHMETIC)
    a, b = WithValidation(env, 100, "question"), WithValidation(env, 100, "prompt")
    assert [e.id for e in a.examples(VALIDATION)] == [e.id for e in b.examples(VALIDATION)]


def test_the_carve_rule_is_recorded_and_kept_on_resume(tmp_path):
    from trainers.rl import grpo

    run = tmp_path / "old-run"
    run.mkdir()
    (run / "config.yaml").write_text("env: GuessNumber-v0\nval_size: 10\n")  # a run from before the option
    assert grpo.resolve(["--resume", str(run)]).val_carve == "prompt"
    assert grpo.resolve(["--env", "GuessNumber-v0", "--val-size", "10", "--out", str(tmp_path / "new")]).val_carve \
        == "question"
