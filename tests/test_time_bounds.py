"""Every entry point that scores model text returns in bounded time (``step``, ``score``,
``score_batch``): a cheap pure-Python scorer under an in-process timer, any other scorer in a
worker process killed at the deadline; and a script without the ``__main__`` guard works (its
workers are forked), or, where workers must re-import it, fails fast with an error naming the guard."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest

import llm_envs
from llm_envs.scoring import GRACE
from toy_envs import CheapEchoEnv, EchoEnv

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 1.5
#: What a call may take beyond its timeout: the kill grace, messaging, a loaded shared machine.
SLACK = GRACE + 1.5


def timed(call, *args):
    start = time.monotonic()
    result = call(*args)
    return result, time.monotonic() - start


@pytest.fixture
def math_env(tmp_path):
    """MATH-v0 on a one-problem data file (no benchmark data needed), its worker started."""
    data = tmp_path / "math.jsonl"
    data.write_text(json.dumps({"problem": "What is 200 + 4?", "answer": "204"}) + "\n")
    env = gym.make("MATH-v0", hub=False, data={"test": str(data)})
    env.unwrapped.score_timeout = TIMEOUT
    env.reset(options={"split": "test", "index": 0})
    assert env.step("So $\\boxed{204}$.")[1] == 1.0  # starts the worker (imports sympy) off the clock
    yield env
    env.close()


# (x+1)^100000 passes every screen of the MATH scorer (short, shallow, small numbers) and then
# keeps sympy busy for minutes, much of it in C code that no signal interrupts.
CRAFTED = "The answer is $\\boxed{(x+1)^{100000}}$."


def test_a_crafted_math_answer_returns_within_the_bound_through_step_and_score(math_env):
    (_, _, _, _, info), seconds = timed(math_env.step, CRAFTED)
    assert seconds < TIMEOUT + SLACK and info["error"] == "timeout" and not info["correct"]
    example = math_env.unwrapped.examples("test")[0]
    score, seconds = timed(math_env.unwrapped.score, CRAFTED, example)
    assert seconds < TIMEOUT + SLACK and (score.reward, score.error) == (0.0, "timeout")
    assert math_env.unwrapped.score("$\\boxed{204}$", example).reward == 1.0  # a new worker took over


@pytest.mark.parametrize("completion", ["hang", "sleep", "c-loop"])
def test_a_worker_scorer_is_killed_at_the_deadline(completion):
    env = EchoEnv()
    env.score_timeout = TIMEOUT
    env.reset(options={"split": "train", "index": 0})
    try:
        assert env.step("0")[1] == 1.0  # worker started
        (_, reward, _, _, info), seconds = timed(env.step, completion)
        assert seconds < TIMEOUT + SLACK and (reward, info["error"]) == (0.0, "timeout")
        example = env.examples("train")[0]
        score, seconds = timed(env.score, completion, example)
        assert seconds < TIMEOUT + SLACK and score.error == "timeout"
        assert env.score("0", example).reward == 1.0
    finally:
        env.close()


def test_a_cheap_scorer_is_timed_in_process_and_stays_fast():
    env = CheapEchoEnv()
    env.score_timeout = TIMEOUT
    example = env.examples("train")[0]
    for completion in ["hang", "sleep"]:  # a Python loop, and a blocking call a signal interrupts
        score, seconds = timed(env.score, completion, example)
        assert seconds < TIMEOUT + 1.0 and score.error == "timeout"
    assert env.score("0", example).reward == 1.0
    assert all(not s._workers for s in env._scorers.values())  # no process was started
    start = time.perf_counter()
    for _ in range(2000):
        env.score("0", example)
    assert (time.perf_counter() - start) / 2000 < 1e-3  # a few microseconds; 1 ms on a busy machine


def test_off_the_main_thread_a_cheap_scorer_is_still_bounded():
    env = CheapEchoEnv()
    env.score_timeout = TIMEOUT
    example = env.examples("train")[0]
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=timed(env.score, "hang", example)))
    try:
        thread.start()
        thread.join(60)
        score, seconds = out["r"]
        # a worker process: its start-up comes on top of the bound
        assert score.error == "timeout" and seconds < TIMEOUT + SLACK + 10
        ok = []
        thread = threading.Thread(target=lambda: ok.append(env.score("0", example)))
        thread.start()
        thread.join(60)
        assert ok[0].reward == 1.0
    finally:
        env.close()


def test_score_batch_bounds_each_item_and_keeps_going():
    env = EchoEnv()
    exs = env.examples("train")
    completions = ["0", "c-loop", "2", "hang", "4"]
    try:
        scores, seconds = timed(env.score_batch, completions, exs[:5], 1, TIMEOUT)
        assert [s.error for s in scores] == [None, "timeout", None, "timeout", None]
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert seconds < 2 * (TIMEOUT + SLACK) + 10  # two timeouts, one worker restart
    finally:
        env.close()


UNGUARDED = """
import time
import gymnasium as gym
import llm_envs, toy_envs

env = gym.make("{env_id}")
env.reset(options={{"split": "train", "index": 0}})
print("reward", env.step("0")[1], flush=True)
"""


@pytest.mark.parametrize("env_id", ["Echo-v0", "CheapEcho-v0"])
def test_a_script_without_the_main_guard_works_or_fails_fast_naming_the_guard(env_id, tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(UNGUARDED.format(env_id=env_id))
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path}, cwd=tmp_path)
    seconds = time.monotonic() - start
    assert seconds < 30, (seconds, proc.stderr[-2000:])
    # CheapEcho: scored in the script's own process; Echo: in a worker forked from the script, which
    # does not re-run the script's top-level code
    assert proc.returncode == 0 and "reward 1.0" in proc.stdout, proc.stderr[-2000:]


def test_a_worker_that_cannot_start_is_a_clear_error_naming_the_cause(tmp_path):
    """Where workers must re-import the main script (no fork), an unguarded one fails fast with
    advice naming the missing guard."""
    script = tmp_path / "user_script.py"
    script.write_text(UNGUARDED.format(env_id="Echo-v0").replace(
        "import llm_envs, toy_envs", "import llm_envs, toy_envs\nllm_envs.scoring.start_method = lambda: 'spawn'"))
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path}, cwd=tmp_path)
    assert time.monotonic() - start < 30, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "WorkerStartError" in last, proc.stderr[-2000:]
    assert 'if __name__ == "__main__":' in last and str(script) in last


def kill_worker(scorer) -> int:
    """SIGKILL the scorer's one worker (as the kernel's OOM killer would) and wait until it is gone."""
    [worker] = scorer._workers
    pid = worker.process.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker.process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def test_a_worker_killed_between_batches_is_replaced():
    """A worker that dies while idle must not break its scorer: the next batch gets a new one."""
    env = EchoEnv()
    exs = env.examples("train")
    with llm_envs.BatchScorer(env, workers=1) as scorer:
        assert [s.reward for s in scorer.score_batch(["0", "1"], exs[:2])] == [1.0, 1.0]
        dead = kill_worker(scorer)
        for _ in range(2):  # and the scorer stays usable after that
            scores = scorer.score_batch(["0", "x", "2"], exs[:3])
            assert [(s.reward, s.error) for s in scores] == [(1.0, None), (0.0, None), (1.0, None)]
        assert [w.process.pid for w in scorer._workers] != [dead]


def test_a_worker_that_exits_mid_batch_reports_its_exit_code():
    """A worker that dies by itself (a crash, not a kill) fails its item with the code it exited with."""
    env = EchoEnv()
    exs = env.examples("train")
    with llm_envs.BatchScorer(env, workers=1) as scorer:
        scores = scorer.score_batch(["0", "exit", "2"], exs[:3], 30)
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0]
        assert scores[1].error == "worker failed (exit code 3)"


def test_a_worker_killed_mid_batch_fails_its_item_only():
    """Killed while scoring: the item in progress fails, the rest of the batch is scored by a new worker."""
    env = EchoEnv()
    exs = env.examples("train")
    with llm_envs.BatchScorer(env, workers=1) as scorer:
        scorer.score_batch(["0"], exs[:1])  # worker started
        threading.Timer(1.0, kill_worker, [scorer]).start()  # during "sleep" (60 s, far below the timeout)
        scores, seconds = timed(scorer.score_batch, ["0", "sleep", "2", "3"], exs[:4], 30)
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 1.0]
        assert scores[1].error == "worker failed (exit code -9)" and seconds < 15  # SIGKILL, as the OOM killer
