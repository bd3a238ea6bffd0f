"""The built-in multi-turn environments: Countdown-calc-v0, Sudoku-feedback-v0, Retry-v0 (GuessNumber-v0
is in test_multiturn.py): Gymnasium's checker, golden episodes, bad input."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs
from llm_envs.envs.countdown_calc import calculator
from llm_envs.envs.sudoku import format_grid
from llm_envs.envs.sudoku_feedback import conflicts, feedback


def calc_call(expression: str) -> str:
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression


@pytest.mark.parametrize("env_id", ["Countdown-calc-v0", "Sudoku-feedback-v0", "GuessNumber-v0", "Retry-v0"])
def test_check_env(env_id):
    env = gym.make(env_id).unwrapped
    check_env(env, skip_render_check=True)
    assert isinstance(env, llm_envs.MultiTurnEnv) and env_id in llm_envs.ENV_IDS


@pytest.mark.parametrize("expression, expected", [
    ("(25 - 5) * 4", "80"), ("7 / 2", "7/2 (= 3.5)"), ("3 × 4", "12"),
    ("__import__('os')", "error: only digits"), ("1 / 0", "error: division by zero"), ("-3 + 1", "error: UnaryOp not allowed"),
    ("2 ** 8", "error: operator Pow"), ("9" * 300, "error: answer longer"),
])
def test_the_calculator_is_countdowns_safe_arithmetic(expression, expected):
    assert calculator(expression).startswith(expected)


def test_the_calculators_schema_is_get_json_schemas():
    from llm_envs.envs.countdown_calc import CALCULATOR

    assert CALCULATOR.schema == llm_envs.tool(calculator).schema


def test_import_llm_envs_stays_light():
    import subprocess
    import sys

    code = "import sys, llm_envs; print('transformers' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["False", "False"]


def test_countdown_calc_golden_episode():
    env = gym.make("Countdown-calc-v0").unwrapped
    obs, _ = env.reset(options={"split": "test", "index": 0})
    example = env._current
    assert obs[0]["role"] == "system" and '"name": "calculator"' in obs[0]["content"]
    assert obs[-1] == {"role": "assistant", "content": "Let me solve this step by step.\n<think>"}
    assert example.meta["numbers"] == [78, 51, 21, 22] and example.meta["target"] == 70
    obs, r, term, trunc, info = env.step(" try " + calc_call("78 - 51 + 21 + 22"))
    assert obs == [{"role": "tool", "name": "calculator", "content": "70"}] and (r, term) == (0.0, False)
    obs, r, term, trunc, info = env.step(calc_call("78 - x"))  # bad expression: the tool answers an error
    assert obs[0]["content"].startswith("error: only digits") and info["tool_errors"] == 1  # "error:" counts
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "calc"}</tool_call>')
    assert obs[0]["content"].startswith("error: unknown tool") and info["tool_errors"] == 2
    _, r, term, trunc, info = env.step("<think>done</think>\n<answer>78 - 51 + 21 + 22</answer>")
    assert (term, trunc, info["correct"], info["tool_calls"]) == (True, False, True, 3)
    assert r == pytest.approx(1.1) and info["return"] == pytest.approx(1.1)


def test_countdown_calc_answers_like_countdown_and_truncates():
    calc, plain = llm_envs.make("Countdown-calc-v0", max_turns=2), llm_envs.make("Countdown-v0")
    ex_calc, ex = calc.examples("test")[3], plain.examples("test")[3]
    for text in ["42</think>\n<answer>" + ex.meta["solution"] + "</answer>", "nothing", "</think>\n<answer>1+1</answer>"]:
        assert calc.score(text, ex_calc).reward == plain.score(text, ex).reward
    calc.reset(options={"split": "test", "index": 0})
    calc.step(calc_call("1 + 1"))
    _, r, term, trunc, _ = calc.step(calc_call("1 + 2"))
    assert (r, term, trunc) == (0.0, False, True)
    with pytest.raises(ValueError, match="max_turns"):
        llm_envs.make("Countdown-calc-v0", max_turns=0)


def test_sudoku_feedback_golden_episode():
    env = gym.make("Sudoku-feedback-v0", attempts=3, attempt_reward=0.5).unwrapped
    env.reset(options={"split": "test", "index": 0})
    puzzle, solution = env._current.meta["puzzle"], env._current.meta["solution"]
    obs, r, term, trunc, info = env.step("no answer")
    assert "could not read a 4x4 grid" in obs[0]["content"] and (r, term) == (0.0, False)
    wrong = [row[:] for row in solution]
    wrong[1][0], wrong[1][1] = wrong[1][1], wrong[1][0]  # swaps a given (row 2 col 1 is 1): changed + conflicts
    obs, r, term, trunc, info = env.step(f"</think>\n<answer>\n{format_grid(wrong)}\n</answer>")
    text = obs[0]["content"]
    assert "changed the given numbers at row 2 column 1" in text and "column 1" in text and "top-left box" not in text
    assert r == pytest.approx(0.5 * 10 / 12) and not term
    _, r, term, trunc, info = env.step(f"<answer>\n{format_grid(solution)}\n</answer>")
    assert (r, term, info["correct"]) == (1.0, True, True) and info["return"] == pytest.approx(1.0 + 0.5 * 10 / 12)
    assert puzzle[1][0] == 1


def test_sudoku_feedback_last_attempt_gets_sudokus_reward():
    fb, plain = llm_envs.make("Sudoku-feedback-v0", attempts=2), llm_envs.make("Sudoku-v0")
    fb.reset(options={"split": "test", "index": 1})
    sol = fb._current.meta["solution"]
    half = [row[:] for row in sol]
    half[0] = half[0][::-1]
    attempt = f"<answer>\n{format_grid(half)}\n</answer>"
    assert fb.step(attempt)[1] == 0.0  # no shaping by default
    _, r, term, trunc, info = fb.step(attempt)
    assert term and not info["correct"] and r == plain.score(attempt, plain.examples("test")[1]).reward > 0
    with pytest.raises(ValueError, match="attempts"):
        llm_envs.make("Sudoku-feedback-v0", attempts=0)
    with pytest.raises(ValueError, match="attempt_reward"):
        llm_envs.make("Sudoku-feedback-v0", attempt_reward=2)


def test_feedback_names_conflicts_and_never_values():
    grid = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 2]]
    assert conflicts(grid) == ["row 4", "column 4", "bottom-right box"]
    text = feedback(f"<answer>\n{format_grid(grid)}\n</answer>", [[0] * 4 for _ in range(4)])
    assert text == "Not solved: these do not hold 1-4 exactly once: row 4, column 4, bottom-right box. Try again."


@pytest.mark.parametrize("env_id", ["Countdown-calc-v0", "Sudoku-feedback-v0", "GuessNumber-v0"])
def test_each_env_runs_under_es_grpo_and_eval(env_id, tiny_model_dir, tmp_path):
    import json

    import eval.__main__ as eval_cli
    from trainers.es import train as es
    from trainers.rl import grpo

    common = ["--env", env_id, "--model", str(tiny_model_dir), "--max-new-tokens", "6", "--eval-limit", "2",
              "--env-args", '{"train_size": 4, "test_size": 2}', "--seed", "0"]
    es.main([*common, "--out", str(tmp_path / "es"), "--iterations", "1", "--population", "2", "--batch-size", "2",
             "--noise", "lowrank", "--temperature", "1"])
    grpo.main([*common, "--out", str(tmp_path / "grpo"), "--steps", "1", "--batch-size", "2", "--group-size", "2",
               "--loss", "dr_grpo"])
    for run in ("es", "grpo"):
        log = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in log if "eval_pass@1" in r] == [0, 1]
    [summary] = eval_cli.main(["--env", env_id, "--model", str(tiny_model_dir), "--limit", "2", "--max-new-tokens", "6",
                               "--env-args", '{"train_size": 4, "test_size": 2}', "--out", str(tmp_path / "eval")])
    assert summary["n"] == 2 and summary["turns_mean"] >= 1


def test_retry_golden_episode_scores_each_attempt_as_the_wrapped_env():
    env = llm_envs.make("Retry-v0", env="Countdown-v0", env_args={"train_size": 4, "test_size": 2}, attempts=3)
    plain = llm_envs.make("Countdown-v0", train_size=4, test_size=2)
    assert env.examples("test") == plain.examples("test") and env.max_new_tokens == plain.max_new_tokens
    obs, _ = env.reset(options={"split": "test", "index": 0})
    example = plain.examples("test")[0]
    assert obs == list(example.prompt)
    wrong = "</think>\n<answer>1 + 1</answer>"
    messages, reward, term, trunc, info = env.step(wrong)
    assert messages == [{"role": "user", "content": "That is not correct. Try again."}] and reward == 0.0
    assert not term and not trunc and info["parts"] == {"attempts": 1.0}
    messages, reward, term, trunc, info = env.step(wrong)  # the second attempt: still wrong, one more to come
    assert not term and reward == 0.0
    messages, reward, term, trunc, info = env.step(wrong)  # the last attempt gets the wrapped env's reward
    assert term and not trunc and messages == [] and not info["correct"]
    assert reward == plain.score_completion(wrong, example).reward  # a later turn: no opening in front
    assert info["return"] == reward and info["parts"]["attempts"] == 3.0


def test_retry_ends_at_a_correct_attempt():
    env = llm_envs.make("Retry-v0", env="Conciseness-v0", attempts=4)
    env.reset(options={"split": "test", "index": 0})
    answer = env._current.answer
    assert env.step("no")[1] == 0.0
    _, reward, term, _, info = env.step(answer)
    assert term and info["correct"] and info["turn"] == 2
    assert reward == llm_envs.make("Conciseness-v0").score_completion(answer, env._current).reward


@pytest.mark.parametrize("kwargs, message", [
    ({"attempts": 0}, "attempts must be an int >= 1"),
    ({"env": "GuessNumber-v0"}, "already multi-turn"),
    ({"env": "Nope-v0"}, "env: unknown env id 'Nope-v0'"),
    ({"env_args": [1]}, "env_args must be a JSON object"),
    ({"feedback": " "}, "feedback must be a non-empty string"),
])
def test_retry_bad_options_are_clear(kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm_envs.make("Retry-v0", **kwargs)


def test_retry_runs_under_es_grpo_and_eval(tiny_model_dir, tmp_path):
    import json

    import eval.__main__ as eval_cli
    from trainers.es import train as es
    from trainers.rl import grpo

    args = '{"env": "Countdown-v0", "attempts": 2, "env_args": {"train_size": 4, "test_size": 2}}'
    common = ["--env", "Retry-v0", "--model", str(tiny_model_dir), "--max-new-tokens", "6", "--eval-limit", "2",
              "--env-args", args, "--seed", "0"]
    es.main([*common, "--out", str(tmp_path / "es"), "--iterations", "1", "--population", "2", "--batch-size", "2",
             "--noise", "lowrank"])
    grpo.main([*common, "--out", str(tmp_path / "grpo"), "--steps", "1", "--batch-size", "2", "--group-size", "2",
               "--loss", "dr_grpo"])
    for run in ("es", "grpo"):
        log = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in log if "eval_pass@1" in r] == [0, 1]
    [summary] = eval_cli.main(["--env", "Retry-v0", "--model", str(tiny_model_dir), "--limit", "2",
                               "--max-new-tokens", "6", "--env-args", args, "--out", str(tmp_path / "eval")])
    assert summary["n"] == 2 and summary["turns_mean"] >= 1
