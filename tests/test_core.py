"""The base class, the data loader, the batched scorer and the registry, on a toy env."""

import json
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs
from llm_envs import DataError, UnknownEnvError
from toy_envs import EchoEnv


def test_all_five_registered():
    for env_id in ["Countdown-v0", "Conciseness-v0", "MATH-v0", "Sudoku-v0", "ARC-AGI-v0"]:
        assert env_id in gym.registry
        assert env_id in llm_envs.ENV_IDS


def test_episode_api():
    env = gym.make("Echo-v0")
    obs, info = env.reset(seed=0, options={"split": "test", "index": 3})
    assert obs == "Say 3." and info["example_id"] == "test-3"
    assert info["messages"] == [{"role": "user", "content": "Say 3."}]
    obs, reward, terminated, truncated, info = env.step("3")
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
    assert info["parts"] == {"exact": 1.0}


def test_check_env_and_reset_determinism():
    env = EchoEnv()
    check_env(env)
    assert env.reset(seed=7)[1]["index"] == env.reset(seed=7)[1]["index"]


def test_reset_errors():
    env = EchoEnv()
    with pytest.raises(KeyError, match="unknown split 'dev'"):
        env.reset(options={"split": "dev"})
    with pytest.raises(IndexError, match="out of range"):
        env.reset(options={"index": 99})
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"idx": 1})
    with pytest.raises(RuntimeError, match="reset"):
        EchoEnv().step("x")


def test_score_never_raises():
    env = EchoEnv()
    ex = env.examples("train")[0]
    s = env.score("boom", ex)
    assert s.reward == 0.0 and not s.correct and "scorer bug" in s.error
    assert env.score(None, ex).error.startswith("completion must be str")


def test_make_unknown_and_bad_kwargs():
    with pytest.raises(UnknownEnvError, match="unknown env id 'Nope-v0'.*Countdown-v0"):
        llm_envs.make("Nope-v0")
    with pytest.raises(TypeError, match="Echo-v0: bad argument"):
        llm_envs.make("Echo-v0", no_such_option=1)
    assert isinstance(llm_envs.make("Echo-v0"), EchoEnv)


def test_score_batch_matches_score_and_times_out():
    env = EchoEnv()
    exs = env.examples("train")
    completions = ["0", "1", "x", "3", "hang", "sleep"] * 3
    examples = [exs[i % 5] for i in range(len(completions))]
    try:
        start = time.monotonic()
        scores = env.score_batch(completions, examples, workers=2, timeout=1.0)
        elapsed = time.monotonic() - start
        assert elapsed < 20
        for c, e, s in zip(completions, examples, scores):
            if c in ("hang", "sleep"):
                assert s.error == "timeout" and s.reward == 0.0
            else:
                assert s == env.score(c, e)
        # the pool survives timeouts and is reused
        assert [s.correct for s in env.score_batch(["0"] * 200, [exs[0]] * 200, workers=2)] == [True] * 200
    finally:
        env.close()
    with pytest.raises(ValueError, match="2 completions for 1 examples"):
        env.score_batch(["a", "b"], exs[:1], workers=0)


def test_data_files(tmp_path):
    rows = [{"question": "Say hi.", "answer": "hi"}, {"question": "Say yo.", "answer": "yo", "id": "b"}]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    js = tmp_path / "d.json"
    js.write_text(json.dumps(rows))
    for path in (jsonl, js):
        env = EchoEnv(data={"train": str(path)})
        assert [e.id for e in env.examples("train")] == ["0", "b"]
        assert env.examples("test")[0].id == "test-0"  # built-in split untouched
    mapping = tmp_path / "m.json"
    mapping.write_text(json.dumps({"x": rows[0], "y": rows[1]}))
    assert [e.id for e in EchoEnv(data={"extra": mapping}).examples("extra")] == ["x", "y"]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q", "answer": "a"}\n{"question": 3, "answer": "a"}\n', r"row 1: field 'question': expected str"),
        ('{"answer": "a"}\n', r"row 0: field 'question': missing"),
        ('{"question": "q", "answer": "a"}\nnot json\n', r"line 2: invalid JSON"),
        ('[1, 2]\n', r"line 1: expected a JSON object"),
    ],
)
def test_malformed_files_name_file_row_field(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=rf"bad.jsonl: .*{message}"):
        EchoEnv(data={"train": path}).examples("train")


def test_missing_file_and_bad_data_arg(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        EchoEnv(data={"train": tmp_path / "nope.json"}).examples("train")
    with pytest.raises(TypeError, match="data must map split names"):
        EchoEnv(data="file.json")
