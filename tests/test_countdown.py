"""Countdown-v0: generator, solver, the paper's reward, hostile answers, data files."""

import json
import random
import re
import time
from fractions import Fraction

import pytest

import llm_envs.envs.countdown as cd  # registers Countdown-v0
import gymnasium as gym
from gymnasium.utils.env_checker import check_env
from llm_envs import DataError
from llm_envs.envs.countdown import CountdownEnv

PAPER_PROMPT = (
    "Using the numbers [44 19 35], create an equation that equals 98. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> "
    "</think> tags. And return the final answer in <answer> </answer> tags, for example <answer> "
    "(1 + 2) / 3 </answer>."
)


@pytest.fixture(scope="module")
def env():
    return CountdownEnv()


@pytest.fixture(scope="module")
def ex(env):
    """44 19 35 -> 98, the paper's example."""
    return env.make_example("ex", [44, 19, 35], 98)


@pytest.fixture(scope="module")
def plain():
    """The paper's example without the opening: the whole assistant turn is the completion."""
    return CountdownEnv(opening=False).make_example("ex", [44, 19, 35], 98)


def wrap(answer: str) -> str:
    return f"<think>let me see</think>\n<answer>{answer}</answer>"


# ----- generator -----------------------------------------------------------------------------
def test_sizes_ids_ranges_and_speed():
    start = time.perf_counter()
    env = CountdownEnv(seed=3)
    train, test = env.examples("train"), env.examples("test")
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"generating 2200 puzzles took {elapsed:.1f}s"  # ~0.6 s when idle
    assert (len(train), len(test)) == (200, 2000)
    assert train[0].id == "countdown-train-0" and test[1999].id == "countdown-test-1999"
    for e in [*train, *test]:
        numbers, target = e.meta["numbers"], e.meta["target"]
        assert 3 <= len(numbers) <= 4 and all(1 <= x <= 99 for x in numbers)
        assert type(target) is int and 10 <= target <= 100
        assert e.answer == {"numbers": numbers, "target": target}
    assert {len(e.meta["numbers"]) for e in test} == {3, 4}


def test_every_recorded_solution_scores_perfect(env):
    for e in [*env.examples("train"), *env.examples("test")]:
        s = env.score(wrap(e.meta["solution"]), e)
        assert s.correct and s.reward == pytest.approx(1.1) and s.error is None, (e, s)


def test_splits_disjoint_and_unique(env):
    def keys(split):
        return [(tuple(sorted(e.meta["numbers"])), e.meta["target"]) for e in env.examples(split)]

    train, test = keys("train"), keys("test")
    assert len(set(train)) == 200 and len(set(test)) == 2000
    assert not set(train) & set(test)


def test_deterministic_per_seed():
    def puzzles(**kw):
        env = CountdownEnv(train_size=30, test_size=60, **kw)
        return [(e.id, e.prompt, e.meta) for split in ("train", "test") for e in env.examples(split)]

    assert puzzles(seed=0) == puzzles(seed=0)
    assert puzzles(seed=0) != puzzles(seed=1)
    # the test split does not move when train_size changes
    a = CountdownEnv(train_size=10, test_size=60).examples("test")
    assert [e.meta for e in a] == [e.meta for e in CountdownEnv(train_size=99, test_size=60).examples("test")]


def test_fast_search_matches_exact_solver():
    rng = random.Random(0)
    for _ in range(25):
        numbers = [rng.randint(1, 99) for _ in range(rng.randint(2, 4))]
        exact = {int(v) for v in cd.reachable_values(numbers) if v.denominator == 1 and 10 <= v <= 100}
        fast = cd.reachable_targets(numbers, 10, 100)
        assert set(fast) == exact, numbers
        for target, expr in fast.items():
            assert cd.check_answer(expr, numbers, target) == (True, None)


def test_solver():
    assert cd.solve([1, 3, 4, 6], 24) is not None  # needs a fraction: 6 / (1 - 3 / 4)
    assert cd.check_answer(cd.solve([1, 3, 4, 6], 24), [1, 3, 4, 6], 24)[0]
    assert cd.solve([1, 1, 1], 100) is None
    assert cd.solve([2, 2], Fraction(1)) == "2 / 2"
    assert cd.render(("-", ("8",), ("-", ("3",), ("1",)))) == "8 - (3 - 1)"
    assert cd.render(("*", ("+", ("1",), ("2",)), ("3",))) == "(1 + 2) * 3"


def test_config_errors():
    for kw in [dict(min_numbers=1), dict(min_numbers=4, max_numbers=3), dict(max_numbers=6),
               dict(min_target=50, max_target=10), dict(train_size=-1)]:
        with pytest.raises(ValueError):
            CountdownEnv(**kw)
    with pytest.raises(ValueError, match="could not generate"):  # target out of reach
        CountdownEnv(max_number=2, min_target=1000, max_target=1000, test_size=1).examples("test")


# ----- prompt --------------------------------------------------------------------------------
def test_prompt_is_tinyzero_style(ex, plain):
    opening = {"role": "assistant", "content": "Let me solve this step by step.\n<think>"}
    assert ex.prompt == [{"role": "system", "content": cd.PAPER_SYSTEM_PROMPT},
                         {"role": "user", "content": PAPER_PROMPT}, opening]
    assert ex.opening == cd.OPENING == opening["content"]
    no_system = CountdownEnv(system_prompt=None).make_example("x", [44, 19, 35], 98)
    assert no_system.prompt == [{"role": "user", "content": PAPER_PROMPT}, opening]
    assert plain.prompt == ex.prompt[:2] and plain.opening == ""
    assert CountdownEnv().examples("test")[0].opening == cd.OPENING  # every split's examples have it
    assert CountdownEnv(opening=False).examples("test")[0].prompt[-1]["role"] == "user"


# ----- reward --------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, fmt", [
    ("<think>a</think>\n<answer>44 + 19 + 35</answer>", 1.0),
    ("  \n<think>a\nb</think>\n<answer>44 + 19 + 35</answer>\n\n", 1.0),
    ("<think>a</think>\n<answer>1</answer>\n<answer>44 + 19 + 35</answer>", 1.0),  # .*? may span
    ("<think>a</think> <answer>44 + 19 + 35</answer>", 0.6),
    ("<think>a</think>\n\n<answer>44 + 19 + 35</answer>", 0.6),
    ("<think>a</think>\n<answer>44 + 19 + 35</answer> done", 0.6),
    ("Sure! <think>a</think>\n<answer>44 + 19 + 35</answer>", 0.6),
    ("<answer>44 + 19 + 35</answer>", 0.5),
    ("<think>a <answer>44 + 19 + 35</answer>", 0.5),
    ("<think>a</think>\n44 + 19 + 35", 0.1),
    ("</think><think>a<answer>44 + 19 + 35", 0.0),
    ("44 + 19 + 35", 0.0),
    ("", 0.0),
])
def test_format_values(env, plain, completion, fmt):
    s = env.score(completion, plain)
    answer = 1.0 if "<answer>44 + 19 + 35</answer>" in completion else 0.0
    assert s.parts == {"format": pytest.approx(fmt), "answer": answer}
    assert s.reward == pytest.approx(0.1 * fmt + answer) and s.correct == (answer == 1.0)


@pytest.mark.parametrize("completion, fmt", [
    ("a</think>\n<answer>44 + 19 + 35</answer>", 1.0),  # closes the opening's <think>, then answers
    (" 44 + 19 = 63, + 35 = 98\n</think>\n<answer>44 + 19 + 35</answer>\n", 1.0),
    ("<think>a</think>\n<answer>44 + 19 + 35</answer>", 1.0),  # a second <think>, as "<think>" + it reads
    ("a</think> <answer>44 + 19 + 35</answer>", 0.6),
    ("a</think>\n<answer>44 + 19 + 35</answer> done", 0.6),
    ("a <answer>44 + 19 + 35</answer>", 0.5),  # the think block is never closed
    ("a</think>\n44 + 19 + 35", 0.1),
    ("", 0.0),
])
def test_format_with_the_opening(env, ex, plain, completion, fmt):
    """The opening's "<think>" is part of the scored turn: a completion earns the format reward it
    would earn with that opening tag written out in full (the paper's code scores "<think>" + it)."""
    s = env.score(completion, ex)
    assert s.parts["format"] == pytest.approx(fmt) == env.score("<think>" + completion, plain).parts["format"]
    assert s.parts["format"] == pytest.approx(_paper_format("<think>" + completion))


def _paper_format(text: str) -> float:
    """The reference rule, written with the paper's regexes."""
    text = text.strip()
    if re.match(r"^<think>.*?</think>\n<answer>.*?</answer>$", text, re.DOTALL):
        return 1.0
    return 0.1 * bool(re.search(r"<think>.*?</think>", text, re.DOTALL)) + 0.5 * bool(
        re.search(r"<answer>.*?</answer>", text, re.DOTALL))


def test_format_and_extraction_agree_with_regexes():
    tokens = ["<think>", "</think>", "<answer>", "</answer>", "\n", " ", "7", "</think>\n<answer>"]
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 9)))
        assert cd.format_reward(text) == pytest.approx(_paper_format(text)), repr(text)
        blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
        assert cd.extract_answer(text) == (blocks[-1].strip() if blocks else None), repr(text)


@pytest.mark.parametrize("answer, numbers, target", [
    ("44 + 19 + 35", [44, 19, 35], 98),
    ("(44+19)+35", [44, 19, 35], 98),
    ("35 + 19 + 44", [44, 19, 35], 98),
    ("6 / (1 - 3 / 4)", [1, 3, 4, 6], 24),  # exact fractions on the way
    ("2 × 3 × 4", [2, 3, 4], 24),
    ("(9 − 1) ÷ 4", [1, 4, 9], 2),
    ("44 + 19 + 35 = 98", [44, 19, 35], 98),
    ("44 +\n19 + 35", [44, 19, 35], 98),
    ("((1 + 2) / 3)", [1, 2, 3], 1),
    ("(" * 90 + "44 + 19 + 35" + ")" * 90, [44, 19, 35], 98),  # deep but short: fine
    ("1 / 3", [1, 3], 0.333333),  # a decimal target from a file: within 1e-5
    ("7 / 2 - 7", [7, 2, 7], -3.5),  # a negative, non-integer target
])
def test_correct_answers(env, answer, numbers, target):
    s = env.score(wrap(answer), env.make_example("x", numbers, target))
    assert s.correct and s.reward == pytest.approx(1.1) and s.error is None


@pytest.mark.parametrize("answer", [
    "44 + 19 - 35",  # wrong value
    "44 + 44 + 10",  # reused number (and 19, 35 missing)
    "44 + 19",  # missing number
    "44 + 19 + 35 + 0",  # extra number
    "44 + 19 + 35 + 35 - 35",  # extra copies
    "4 + 4 + 19 + 35 + 36",  # digits split differently
    "44 + 19 + 35 = 97",  # claims a value other than the target
])
def test_wrong_answers(env, ex, answer):
    s = env.score(wrap(answer), ex)
    assert (s.parts["answer"], s.correct, s.error) == (0.0, False, None)
    assert s.reward == pytest.approx(0.1)


def test_only_the_last_answer_counts(env, ex):
    assert env.score("<answer>1 + 2</answer> no wait <answer>44 + 19 + 35</answer>", ex).correct
    assert not env.score("<answer>44 + 19 + 35</answer> no wait <answer>1 + 2</answer>", ex).correct
    assert not env.score("<answer>44 + 19 + 35</answer>\n<answer></answer>", ex).correct


def test_scored_on_the_completion_only(env, ex):
    # The user's prompt holds "<think> </think>" and an <answer> example; only the assistant's turn counts.
    assert "<answer> (1 + 2) / 3 </answer>" in ex.prompt[-2]["content"]
    s = env.score("44 + 19 + 35", ex)
    assert (s.reward, s.parts) == (0.0, {"format": 0.0, "answer": 0.0})
    env.reset(options={"split": "test", "index": 0})
    example = env.examples("test")[0]
    assert env.step(example.meta["solution"])[1] == 0.0  # no tags: no reward
    assert env.step(wrap(example.meta["solution"]))[1] == pytest.approx(1.1)


EXPLOITS = [
    "__import__('os').system('echo hi')",
    "2**100**100",
    "9**9**9",
    "10//3",
    "44 % 19 + 35",
    "a + b + c",
    "abs(44) + 19 + 35",
    "(lambda: 98)()",
    "[44, 19, 35][0] + 54",
    "-44 + 19 * 35 - 533",  # unary minus
    "+44 + 19 + 35",  # unary plus
    "44.0 + 19 + 35",
    "1e308*1e308",
    "0x2C + 19 + 35",
    "4_4 + 19 + 35",
    "44 + 19 + 35; 1",
    "35 / (44 - 44) + 19",
    "98",
    "1" * 1000,
    "(" * 10000 + "44 + 19 + 35" + ")" * 10000,
    "(" * 150 + "44 + 19 + 35" + ")" * 150,  # legal but over the 200-character limit
    "(" * (1 << 20),
    "44 + 19 + 35 = 1e999",
]


@pytest.mark.parametrize("answer", EXPLOITS, ids=range(len(EXPLOITS)))
def test_exploits_score_zero_without_running_anything(env, ex, answer, capfd):
    start = time.perf_counter()
    s = env.score(wrap(answer), ex)
    assert time.perf_counter() - start < 1.0
    assert (s.parts["answer"], s.correct) == (0.0, False) and s.reward == pytest.approx(0.1)
    assert "hi" not in capfd.readouterr().out


def test_unparseable_answers_say_why(env, ex):
    assert env.score(wrap("10//3"), ex).error == "operator FloorDiv not allowed"
    assert env.score(wrap("-44 + 19"), ex).error == "UnaryOp not allowed"
    assert env.score(wrap("35 / (44 - 44) + 19"), ex).error == "division by zero"
    assert "only digits" in env.score(wrap("a + b"), ex).error
    assert "longer than" in env.score(wrap("(" * 5000), ex).error
    assert env.score(wrap(""), ex).error == "empty answer"
    assert env.score("no answer at all", ex).error is None


@pytest.mark.parametrize("completion", [
    "(" * (1 << 20),
    "<answer>" * 100_000,
    "<answer>1</answer>" + "<answer>" * 100_000,
    "<think>" + "</think>\n<answer>" * 10_000 + "x",
    "<think>" + "</think>\n<answer>" * 10_000 + "</answer>",
    "<think>" * 50_000 + "</answer>",
])
def test_hostile_completions_stay_fast(env, ex, completion):
    start = time.perf_counter()
    s = env.score(completion, ex)
    assert time.perf_counter() - start < 1.0 and not s.correct


def test_expression_evaluator():
    assert cd.evaluate_expression("6 / (1 - 3 / 4)") == (Fraction(24), [6, 1, 3, 4])
    with pytest.raises(cd.ExpressionError, match="Pow"):
        cd.evaluate_expression("2 ** 3")
    with pytest.raises(cd.ExpressionError, match="larger than"):
        cd.evaluate_expression("10000000 - 9999999")


# ----- gymnasium and batch API -----------------------------------------------------------------
def test_check_env_and_registration():
    env = gym.make("Countdown-v0").unwrapped
    assert isinstance(env, CountdownEnv) and env.max_new_tokens == 512
    check_env(env)
    obs, info = env.reset(options={"split": "train", "index": 0})
    assert obs.endswith(PAPER_PROMPT[-60:] + "\n\n" + cd.OPENING) and info["example_id"] == "countdown-train-0"


def test_score_batch_matches_score(env):
    examples = env.examples("test")[:500] * 2
    completions = []
    for i, e in enumerate(examples):
        kind = i % 5
        completions.append([
            wrap(e.meta["solution"]),
            f"<answer>{e.meta['solution']}</answer>",
            wrap("1 + 2"),
            wrap("2**100**100"),
            "<think>hmm</think>",
        ][kind])
    batch = env.score_batch(completions, examples, workers=2)
    env.close()
    assert batch == [env.score(c, e) for c, e in zip(completions, examples)]
    assert sum(s.correct for s in batch) == 400


# ----- data files --------------------------------------------------------------------------------
def test_load_paper_json_and_jsonl(tmp_path):
    paper = tmp_path / "countdown.json"
    paper.write_text(json.dumps([
        {"id": 7, "context": "ignored", "numbers": [44, 19, 35], "target": "98", "solution": "44+19+35"},
        {"id": 8, "context": "", "numbers": [7, 2, 7], "target": "-3.5", "solution": ""},
    ]))
    lines = tmp_path / "d.jsonl"
    lines.write_text('{"nums": [2, 3, 4], "target": 24}\n\n{"nums": [1, 3, 4, 6], "target": 24.0}\n')
    env = CountdownEnv(data={"test": paper, "dev": lines})
    a, b = env.examples("test")
    assert (a.id, a.answer, a.meta["solution"]) == ("7", {"numbers": [44, 19, 35], "target": 98}, "44+19+35")
    assert a.prompt[-2]["content"] == PAPER_PROMPT and a.opening == cd.OPENING
    assert b.answer["target"] == -3.5 and "equals -3.5." in b.prompt[-2]["content"]
    assert env.score(wrap("7 / 2 - 7"), b).correct
    c, d = env.examples("dev")
    assert (c.id, c.answer, d.answer["target"]) == ("0", {"numbers": [2, 3, 4], "target": 24}, 24)
    assert type(d.answer["target"]) is int
    assert env.score(wrap("6 / (1 - 3 / 4)"), d).correct
    # generated train puzzles avoid the user's test puzzles
    assert len(env.examples("train")) == 200


@pytest.mark.parametrize("row, field", [
    ({"target": 5}, "numbers"),
    ({"numbers": "1 2 3", "target": 5}, "numbers"),
    ({"numbers": [1, 2.5], "target": 5}, "numbers"),
    ({"nums": [1, True], "target": 5}, "nums"),
    ({"numbers": [1, -2], "target": 5}, "numbers"),
    ({"numbers": [], "target": 5}, "numbers"),
    ({"numbers": [1, 2]}, "target"),
    ({"numbers": [1, 2], "target": "abc"}, "target"),
    ({"numbers": [1, 2], "target": "nan"}, "target"),
    ({"numbers": [1, 2], "target": [3]}, "target"),
    ({"numbers": [1, 2], "target": True}, "target"),
])
def test_malformed_rows_name_file_row_field(tmp_path, row, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"numbers": [1, 2], "target": 3}, row]))
    with pytest.raises(DataError) as info:
        CountdownEnv(data={"test": path}).examples("test")
    assert str(path) in str(info.value) and "row 1" in str(info.value) and repr(field) in str(info.value)
