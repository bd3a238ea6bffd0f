"""Conciseness-v0: the paper's prompts, the length reward and the correctness flag."""

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs.envs.conciseness  # noqa: F401  (registers Conciseness-v0)
from llm_envs.data import DataError
from llm_envs.envs.conciseness import ConcisenessEnv


@pytest.fixture(scope="module")
def env():
    return gym.make("Conciseness-v0").unwrapped


def by_answer(env, answer, split="test"):
    return next(e for e in env.examples(split) if e.answer == answer)


def test_papers_prompts(env):
    train, test = env.examples("train"), env.examples("test")
    assert [(e.prompt, e.answer) for e in train] == [
        ([{"role": "user", "content": "Solve: 3 + 5 ="}], "8"),
        ([{"role": "user", "content": "If all birds can fly and penguins are birds, can penguins fly"}], "No"),
    ]
    assert [e.answer for e in test] == ["Paris", "84", "True", "10", "Hola", "30", "Red", "7"]
    assert test[1].prompt[0]["content"] == "Calculate: 12 × 7 ="
    assert all(len(e.prompt) == 1 and e.prompt[0]["role"] == "user" for e in train + test)
    assert len({e.id for e in train + test}) == 10


@pytest.mark.parametrize(
    "completion, reward, length",
    [
        ("Paris", 0.0, 5),
        ("The capital of France is Paris.", -26.0, 31),  # 31 - 5
        ("Pa", -3.0, 2),  # shorter than the solution is penalised too
        ("", -5.0, 0),
        ("  Paris\n", 0.0, 5),  # surrounding whitespace is not counted
        ("x" * 3005, -3000.0, 3005),
    ],
)
def test_reward_is_negative_length_gap(env, completion, reward, length):
    score = env.score(completion, by_answer(env, "Paris"))
    assert score.reward == reward and score.error is None
    assert score.parts["length"] == length
    assert score.parts["normalized"] == pytest.approx(max(0.0, 1 + reward / 2000))


def test_normalized_scale(env):
    ex = by_answer(env, "84")
    assert env.score("84", ex).parts["normalized"] == 1.0
    assert env.score("8" * 1002, ex).parts["normalized"] == pytest.approx(0.5)  # reward -1000
    assert env.score("8" * 2002, ex).parts["normalized"] == 0.0  # reward -2000
    assert env.score("8" * 5000, ex).parts["normalized"] == 0.0  # clipped


def test_raw_length_option():
    env = ConcisenessEnv(strip=False)
    ex = env.examples("train")[0]  # "8"
    assert env.score(" 8\n", ex).reward == -2.0
    assert env.score(" 8\n", ex).parts["length"] == 3


def test_correct_flag_is_separate_from_reward(env):
    paris = by_answer(env, "Paris")
    short_wrong = env.score("Rome", paris)
    long_right = env.score("The capital of France is Paris, a city on the Seine.", paris)
    assert short_wrong.reward > long_right.reward
    assert not short_wrong.correct and long_right.correct
    assert env.score("PARIS!", paris).correct  # case-insensitive


def test_correct_needs_a_whole_word(env):
    seven = by_answer(env, "7")
    assert env.score("7", seven).correct
    assert env.score("There are 7 days.", seven).correct
    assert env.score("Seven", seven).correct  # an accepted spelling
    assert not env.score("17", seven).correct
    assert not env.score("7.5", seven).correct and not env.score("1,7", seven).correct
    assert env.score("It is 7.", seven).correct
    no = env.examples("train")[1]
    assert env.score("No, penguins cannot fly.", no).correct
    assert not env.score("I don't know", no).correct  # "No" inside "know" does not count


def test_any_primary_color_is_correct_but_reward_uses_red(env):
    color = by_answer(env, "Red")
    assert color.meta["accepted"] == ["Red", "Blue", "Yellow"]
    assert env.score("Blue", color).correct and env.score("Blue", color).reward == -1.0
    assert not env.score("Green", color).correct


def test_score_never_raises(env):
    ex = by_answer(env, "Paris")
    score = env.score(None, ex)  # type: ignore[arg-type]
    assert score.reward == 0.0 and not score.correct and score.error
    assert env.score("Paris", type(ex)(id="x", prompt=ex.prompt, answer=ex.answer, meta={})).error


def test_check_env_and_episode(env):
    check_env(env, skip_render_check=True)
    obs, info = env.reset(options={"split": "test", "index": 0})
    assert obs == "What is the capital of France?"
    _, reward, terminated, _, info = env.step("Paris")
    assert (reward, terminated, info["correct"]) == (0.0, True, True)


def test_score_batch_matches_score(env):
    examples = list(env.examples("test")) * 5
    completions = [e.answer + " is the answer" * (i % 4) for i, e in enumerate(examples)]
    try:
        assert env.score_batch(completions, examples, workers=2) == [
            env.score(c, e) for c, e in zip(completions, examples)]
    finally:
        env.close()


def test_own_data(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"prompt": "Largest planet?", "solution": "Jupiter"},
            {"id": "q2", "prompt": "2 + 2 =", "solution": "4", "accepted": ["four"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = ConcisenessEnv(data={"train": path})
    first, second = env.examples("train")
    assert (first.id, first.answer) == ("0", "Jupiter")
    assert first.prompt == [{"role": "user", "content": "Largest planet?"}]
    assert second.id == "q2" and env.score("Four", second).correct
    assert env.score("Jupiter!", first).reward == -1.0
    assert len(env.examples("test")) == 8  # built-in splits stay available


@pytest.mark.parametrize(
    "row, field",
    [
        ({"solution": "4"}, "prompt"),
        ({"prompt": "2 + 2 ="}, "solution"),
        ({"prompt": "2 + 2 =", "solution": 4}, "solution"),
        ({"prompt": ["2 + 2 ="], "solution": "4"}, "prompt"),
        ({"prompt": "  ", "solution": "4"}, "prompt"),
        ({"prompt": "2 + 2 =", "solution": "4", "accepted": "four"}, "accepted"),
    ],
)
def test_malformed_rows_name_file_row_field(tmp_path, row, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"prompt": "ok", "solution": "ok"}, row]))
    with pytest.raises(DataError) as info:
        ConcisenessEnv(data={"train": path}).examples("train")
    message = str(info.value)
    assert str(path) in message and "row 1" in message and f"field {field!r}" in message


def test_invalid_json_names_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a", "solution": "b"}\n{"prompt": \n')
    with pytest.raises(DataError, match="broken.jsonl: line 2"):
        ConcisenessEnv(data={"train": path}).examples("train")
