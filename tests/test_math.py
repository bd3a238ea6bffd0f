"""MATH-v0: data sources and the math-verify reward.

The reward and loader tests run everywhere, on hand-made problems written below in the benchmark
files' shape. Two tests read the real benchmark files (``shared_data``, see conftest) and skip
without them: the five benchmarks load with the right counts, and math-verify accepts their
reference answers.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest

from llm_envs import DataError, Example
from llm_envs.envs.math_reasoning import BENCHMARKS, DATA_DIR_ENV, MathEnv, last_boxed

COUNTS = {"math500": 500, "aime24": 30, "amc23": 40, "minerva": 272, "olympiadbench": 674}
INSTRUCTION = "Please reason step by step"
SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."

#: Hand-made (problem, answer) pairs: integers, fractions, radicals, tuples, sets, intervals, degrees.
PROBLEMS = [
    ("Aya walks 9 km at $s$ km/h and stops at a coffee shop ... How many minutes does it take?", "204"),
    ("Simplify $\\frac{6}{12}$.", "\\frac{1}{2}"),
    ("Write $\\sqrt{8}$ in simplest radical form.", "2\\sqrt{2}"),
    ("Convert the point $(0,3)$ to polar coordinates.", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("List the solutions of $x^2 = 1$.", "\\{-1,1\\}"),
    ("Each interior angle of a regular octagon measures how many degrees?", "135^\\circ"),
    ("Solve $x^2 < 4$.", "(-2, 2)"),
    ("Compute $\\binom{5}{2} \\cdot 0.1$.", "1"),
    ("What is $2^{10}$?", "1024"),
    ("Write $0.\\overline{3}$ as a fraction.", "\\frac{1}{3}"),
]


def rows(n: int = len(PROBLEMS), **extra) -> list[dict]:
    """``n`` rows in the benchmark files' shape (the instruction ends the problem), cycling PROBLEMS."""
    return [{"problem": PROBLEMS[i % len(PROBLEMS)][0] + SUFFIX, "answer": PROBLEMS[i % len(PROBLEMS)][1],
             **extra} for i in range(n)]


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in items) + "\n")
    return path


def boxed(answer: str) -> str:
    return f"Some reasoning.\nThe final answer is $\\boxed{{{answer}}}$."


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """MATH-v0 on the hand-made problems (``test`` split, read through ``data=``)."""
    path = write_jsonl(tmp_path_factory.mktemp("math") / "hand.jsonl", rows())
    env = MathEnv(data={"test": path}, hub=False)
    yield env
    env.close()


def example(answer: str) -> Example:
    return Example("hand", [{"role": "user", "content": "?"}], answer)


# ----- data -------------------------------------------------------------------------------------
def test_real_benchmarks_load_with_right_counts(shared_data, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(shared_data("math")))
    env = MathEnv(hub=False)
    assert BENCHMARKS == tuple(COUNTS)
    for name, count in COUNTS.items():
        examples = env.examples(name)
        assert len(examples) == count, name
        assert len({e.id for e in examples}) == count, f"{name}: ids not unique"
        for e in examples:
            assert [m["role"] for m in e.prompt] == ["system", "user"]
            assert "\\boxed{}" in e.prompt[0]["content"]
            assert INSTRUCTION not in e.prompt[1]["content"], e.id
            assert e.prompt[1]["content"].strip() and e.answer
    assert env.examples("math500")[17].id == "math500-17"
    assert [e.answer for e in env.examples("test")] == [e.answer for e in env.examples("math500")]
    assert "Aya" in env.examples("aime24")[0].prompt[1]["content"]


def test_data_dir_kwarg_and_gym_make(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "aime24.jsonl", rows())
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    env = gym.make("MATH-v0", data_dir=tmp_path, hub=False)
    obs, info = env.reset(seed=0, options={"split": "aime24", "index": 0})
    assert "Aya" in obs and INSTRUCTION in obs  # the system prompt carries the instruction once
    assert obs.count(INSTRUCTION) == 1
    examples = env.unwrapped.examples("aime24")
    assert [e.id for e in examples[:2]] == ["aime24-0", "aime24-1"]
    assert [e.answer for e in examples] == [a for _, a in PROBLEMS]
    _, reward, terminated, truncated, info = env.step(boxed("204"))
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
    env.close()


def test_check_env(tmp_path):
    from gymnasium.utils.env_checker import check_env

    # check_env resets the default ("train") split.
    checked = gym.make("MATH-v0", data={"train": write_jsonl(tmp_path / "t.jsonl", rows())}, hub=False).unwrapped
    check_env(checked)
    checked.close()


def test_data_arg_with_solution_field(tmp_path):
    # The MATH train split's shape: a worked solution whose last \boxed{} holds the answer.
    items = [{"problem": r["problem"], "level": "Level 4",
              "solution": f"First \\boxed{{0}}; so the answer is \\boxed{{{r['answer']}}}."} for r in rows(4)]
    examples = MathEnv(data={"train": write_jsonl(tmp_path / "train.jsonl", items)}).examples("train")
    assert [e.answer for e in examples] == [a for _, a in PROBLEMS[:4]]
    assert examples[0].meta["level"] == 4 and examples[0].id == "math-0"
    assert INSTRUCTION not in examples[0].prompt[1]["content"]


def test_train_levels_filter(tmp_path, monkeypatch):
    items = rows(40)
    for i, row in enumerate(items):  # the benchmark files carry no level; MATH train rows do
        row["level"] = f"Level {i % 5 + 1}"
    write_jsonl(tmp_path / "train.jsonl", items)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    kept = MathEnv(hub=False).examples("train")
    assert [e.meta["level"] for e in kept[:4]] == [3, 4, 5, 3]
    assert len(kept) == 24 and 40 == len(MathEnv(hub=False, train_levels=None).examples("train"))


def test_hub_fallback(monkeypatch):
    """The hub path, with ``datasets`` stood in by a module serving hand-made rows."""
    items = rows(20)
    calls = []

    def load_dataset(path, config=None, split=None):
        calls.append((path, config, split))
        if path == "DigitalLearningGmbH/MATH-lighteval":
            raise ConnectionError("offline")
        if path == "EleutherAI/hendrycks_math":  # MATH train shape: solution + level, per subject
            return [{"problem": r["problem"], "solution": f"\\boxed{{{r['answer']}}}",
                     "level": "Level 5", "type": config} for r in items[:2]]
        return [{**r, "unique_id": f"test/{i}.json"} for i, r in enumerate(items)]

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "datasets", type(sys)("datasets"))
    monkeypatch.setattr(sys.modules["datasets"], "load_dataset", load_dataset, raising=False)
    env = MathEnv()
    test = env.examples("test")
    assert len(test) == 20 and test[3].id == "test/3.json" and test[3].answer == items[3]["answer"]
    train = env.examples("train")
    assert len(train) == 14 and train[0].meta == {"level": 5, "subject": "algebra"}
    assert calls[1] == ("DigitalLearningGmbH/MATH-lighteval", None, "train")
    with pytest.raises(DataError, match="no hub source for 'aime24'"):
        env.examples("aime24")


def test_no_data_explains_how_to_get_it(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # the hub is unreachable
    for split in ("train", "math500", "aime24"):
        with pytest.raises(DataError) as err:
            MathEnv().examples(split)
        message = str(err.value)
        assert DATA_DIR_ENV in message and "data=" in message and "datasets" in message, message


def test_bad_files_name_file_row_field(tmp_path, monkeypatch):
    row = rows(1)[0]
    bad = write_jsonl(tmp_path / "aime24.jsonl", [row, {"problem": row["problem"]}])
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(DataError, match=r"aime24\.jsonl: row 1: field 'answer'"):
        MathEnv(hub=False).examples("aime24")
    with pytest.raises(DataError, match=r"aime24\.jsonl: row 1: field 'answer'"):
        MathEnv(data={"test": bad}).examples("test")
    write_jsonl(bad, [{"problem": "p", "solution": "no box here"}])
    with pytest.raises(DataError, match=r"row 0: field 'solution'"):
        MathEnv(data={"test": bad}).examples("test")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(DataError, match="not a directory"):
        MathEnv(hub=False).examples("aime24")


# ----- reward -----------------------------------------------------------------------------------
def test_real_golden_answers_score_one(shared_data, monkeypatch):
    """math-verify must accept (nearly) every reference of the real benchmarks against itself."""
    monkeypatch.setenv(DATA_DIR_ENV, str(shared_data("math")))
    env = MathEnv(hub=False)
    failures, total = {}, 0
    for name in BENCHMARKS:
        examples = env.examples(name)
        sample = examples[:: max(1, len(examples) // 60)]  # ~60 per file keeps this fast
        failed = [e.id for e in sample if env.score(boxed(e.answer), e).reward != 1.0]
        failures[name] = failed
        total += len(sample)
        assert len(failed) <= 0.02 * len(sample), f"{name}: golden answers rejected: {failed}"
    print("golden failures:", failures, "of", total)


def test_hand_made_answers_score_one(env):
    examples = env.examples("test")
    assert [e.answer for e in examples] == [a for _, a in PROBLEMS]
    for e in examples:
        score = env.score(boxed(e.answer), e)
        assert (score.reward, score.correct, score.parts, score.error) == (
            1.0, True, {"answer": 1.0, "boxed": 1.0}, None), e.answer


@pytest.mark.parametrize(
    "gold, prediction",
    [
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "\\dfrac{1}{2}"),
        ("\\frac{1}{2}", "\\tfrac12"),
        ("\\frac{1}{2}", "1/2"),
        ("3", "x = 3"),
        ("3", "3.0"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
        ("10", "10^\\circ"),
        ("135^\\circ", "135"),
        ("\\{1,2\\}", "\\{2, 1\\}"),
        ("(-2, 2)", "(-2,2)"),
    ],
)
def test_equivalent_forms_score_one(env, gold, prediction):
    score = env.score(boxed(prediction), example(gold))
    assert (score.reward, score.correct, score.parts, score.error) == (
        1.0, True, {"answer": 1.0, "boxed": 1.0}, None)


@pytest.mark.parametrize(
    "gold, prediction",
    [("204", "205"), ("204", "x"), ("\\frac{1}{2}", "\\frac{1}{3}"), ("\\frac{1}{2}", "2"),
     ("2\\sqrt{2}", "\\sqrt{2}"), ("(-2, 2)", "[-2, 2]"), ("\\{-1,1\\}", "\\{1\\}")],
)
def test_wrong_answers_score_zero(env, gold, prediction):
    score = env.score(boxed(prediction), example(gold))
    assert (score.reward, score.correct, score.parts, score.error) == (
        0.0, False, {"answer": 0.0, "boxed": 1.0}, None)


def test_last_boxed_wins_and_missing_answers(env):
    ex = example("204")
    assert env.score(boxed(""), ex).parts == {"answer": 0.0, "boxed": 1.0}
    # Only the last boxed answer counts.
    assert env.score("\\boxed{205} no wait \\boxed{204}", ex).reward == 1.0
    assert env.score("\\boxed{204} no wait \\boxed{205}", ex).reward == 0.0
    assert env.score("\\boxed{\\frac{1}{2}} so \\fbox{204}", ex).reward == 1.0
    # A truncated, never-closed box is not an answer: the last complete one is.
    assert env.score("\\boxed{204} and then \\boxed{20", ex).reward == 1.0
    none = env.score("The answer is 204.", ex)
    assert (none.reward, none.correct, none.parts) == (0.0, False, {"answer": 0.0, "boxed": 0.0})


def test_last_boxed_extractor():
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\{1,2\\}} \\fbox{7}") == "7"
    assert last_boxed("\\boxed {x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{1} \\boxed{2") == "1"
    assert last_boxed("} \\boxed") is None


def test_pathological_completions_are_fast_and_safe(env):
    ex = example("204")
    cases = [
        "\\boxed{" * 20_000,  # thousands of unclosed boxes
        "{" * 100_000 + "\\boxed{1}" + "}" * 100_000,
        "x" * 500_000 + "\\boxed{204}",  # long text, correct answer at the end
        "\\boxed{" + "1+" * 5_000 + "1}",  # over-long answer
        "\\boxed{" + "(" * 40 + "204" + ")" * 40 + "}",  # deep nesting
        "\\boxed{9^{9^{9^{9}}}}",  # a power tower sympy would try to evaluate
        "\\boxed{10^{10^{10}}}",
        "\\boxed{99999999999!}",
        "\\boxed{\\frac{}{}}\\boxed{\\sqrt[}",
        "\\boxed{\x00\ud800}",
    ]
    for completion in cases:
        start = time.monotonic()
        score = env.score(completion, ex)
        assert time.monotonic() - start < 3.0, completion[:40]
        assert score.error is None, (completion[:40], score.error)
        assert score.reward == (1.0 if completion is cases[2] else 0.0), completion[:40]


def test_score_from_threads_leaves_signals_alone(env):
    examples = [env.examples("test")[i % len(PROBLEMS)] for i in range(16)]
    completions = [boxed(e.answer) for e in examples]
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(env.score, completions, examples))
    assert [s.error for s in scores] == [None] * 16
    assert all(s.reward == 1.0 for s in scores)
    # In the main thread, scoring must not touch SIGALRM (the batch scorer's timer uses it).
    handler = signal.getsignal(signal.SIGALRM)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert env.score(completions[0], examples[0]).reward == 1.0
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 90.0
        assert signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_score_batch_with_workers(env):
    examples = [env.examples("test")[i % len(PROBLEMS)] for i in range(40)]
    completions = [boxed(e.answer) if i % 2 == 0 else boxed("-123456") for i, e in enumerate(examples)]
    completions[1] = "\\boxed{10^{10^{10}}}"
    scores = env.score_batch(completions, examples, workers=2)
    assert [s.reward for s in scores] == [1.0 if i % 2 == 0 else 0.0 for i in range(40)]
    assert all(s.error is None for s in scores)
