"""docs/writing-an-env.md's multi-turn example, the "done" of issue 56: a user-written env whose tool
reads hidden state, written from the page alone (the test takes the code from the page, under a
module name of its own), imports only public names, passes ``python -m llm_envs.check``, and
trains under ES, GRPO and PPO on a tiny model with its turns and tool calls in each log
(tests/test_trl_episodes.py runs it under TRL)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import llm_envs
from trainers.es import train as es
from trainers.rl import grpo, ppo

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "writing-an-env.md"
EXAMPLE = ROOT / "examples" / "bulls_cows.py"
#: Options that make a random tiny model's turns end (its text holds one of these characters within
#: a few tokens) and its first turn call the tool (the opening is a whole call the turn continues).
TINY_TURNS = {"max_turns": 3, "stop_strings": list(" aeinost"),
              "opening": '<tool_call>{"name": "digit_at", "arguments": {"position": 1}}</tool_call> '}


def example_code() -> str:
    block = PAGE.read_text().split("<!-- multiturn-env-example -->", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.DOTALL).group(1)


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    """The page's code saved as a user's module, ``bulls_envs``, importable here and in subprocesses."""
    (tmp_path / "bulls_envs.py").write_text(example_code())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return "bulls_envs"


def test_the_page_shows_the_example_file_and_it_imports_public_names_only():
    assert example_code() == EXAMPLE.read_text()
    imported = []
    for node in ast.walk(ast.parse(example_code())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llm_envs"):
            assert node.module == "llm_envs", f"imports from {node.module}: not the public API"
            imported += [alias.name for alias in node.names]
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("llm_envs") for a in node.names)
    assert imported and set(imported) <= set(llm_envs.__all__)


def test_the_example_runs_and_passes_the_check(user_module, tmp_path):
    run = subprocess.run([sys.executable, str(tmp_path / "bulls_envs.py")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 0 and "reward 0.9" in run.stdout, run.stderr
    check = subprocess.run([sys.executable, "-m", "llm_envs.check", f"{user_module}:BullsAndCows-v0"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    out = check.stdout
    code = llm_envs.make(f"{user_module}:BullsAndCows-v0").examples("test")[0].answer
    assert f"tool digit_at: digit 1 is {code[0]}" in out  # the tool read the hidden code
    assert "-> reward 0.9, terminated, correct, tool calls 1" in out  # and the reveal cost the episode
    assert "ok: the good reply solves the episode" in out and "FAIL" not in out
    listed = subprocess.run([sys.executable, "-m", "llm_envs.list", "--module", user_module, "--namespace", "none"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert listed.returncode == 0 and f"{user_module}:BullsAndCows-v0" in listed.stdout


def test_it_trains_under_es_grpo_and_ppo_with_turns_and_tool_calls_in_each_log(user_module, tiny_model_dir, tmp_path):
    common = ["--env", f"{user_module}:BullsAndCows-v0", "--env-args", json.dumps(TINY_TURNS),
              "--model", str(tiny_model_dir), "--max-new-tokens", "6", "--eval-every", "0", "--eval-limit", "2",
              "--seed", "0", "--dtype", "fp32"]
    es.main([*common, "--out", str(tmp_path / "es"), "--iterations", "1", "--population", "2", "--sigma", "0.05",
             "--batch-size", "2", "--noise", "lowrank"])
    grpo.main([*common, "--out", str(tmp_path / "grpo"), "--steps", "1", "--batch-size", "2", "--group-size", "2"])
    ppo.main([*common, "--out", str(tmp_path / "ppo"), "--steps", "1", "--batch-size", "2"])
    for run in ("es", "grpo", "ppo"):
        log = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        [step] = [r for r in log if "reward_mean" in r]
        # every first turn called the tool (the opening); turns end at the stop strings, so the env answers
        assert step["tool_calls_mean"] == 1.0 and step["tool_errors_mean"] == 0.0, (run, step)
        assert step["turns_mean"] > 1 and 0 <= step["truncated_rate"] <= 1, (run, step)
        assert step["return_mean"] == step["reward_mean"], (run, step)
        held_out = [r for r in log if "eval_reward" in r]
        assert held_out and all(r["eval_turns_mean"] > 1 and r["eval_tool_calls_mean"] == 1.0 for r in held_out)
        assert (tmp_path / run / "final").is_dir()
        tags = _tensorboard_tags(tmp_path / run / "tb")
        assert {f"train/{name}" for name in ("turns_mean", "tool_calls_mean", "tool_errors_mean", "truncated_rate",
                                             "return_mean")} <= tags, run  # trainers.common.tracking's names


def _tensorboard_tags(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return set(events.Tags()["scalars"])
