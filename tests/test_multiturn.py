"""Multi-turn episodes: the Gymnasium API of ``MultiTurnEnv``, tools and their failures, and the
batched runner (``trainers.common.episodes``): exact token ids, masks, limits, seeds."""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs
from llm_envs import Example, MultiTurnEnv, Reply, chat, tool
from llm_envs.multiturn import TurnExample
from llm_envs.tools import run_tool_calls
from trainers.common.episodes import _lowrank_call, bridge_ids, run_episodes, turn_seed
from trainers.common.rollout import rollout
from trainers.engines import make_engine
from trainers.engines.generation import GenerationResult, TokenIds, encode_prompts
from trainers.es.noise.members import LowRankMembers


class Scripted:
    """An engine stand-in: row k of turn t answers ``turns[t]`` (its ids + the stop token); it
    records every prompt it was given."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, []

    def generate(self, prompts, max_new_tokens=64, **kwargs):
        self.calls.append([list(p) for p in prompts])
        text = self.turns[min(len(self.calls) - 1, len(self.turns) - 1)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        ids, done = ids[:max_new_tokens], len(ids) <= max_new_tokens
        n = len(prompts)
        return GenerationResult([text] * n, [len(ids)] * n, [done] * n, [list(ids)] * n, [1] * n, 0.0)


# ----- the guessing game through Gymnasium --------------------------------------------------------


def test_guess_number_episode_and_check_env():
    env = gym.make("GuessNumber-v0", max_turns=3)
    check_env(env.unwrapped)
    obs, _ = env.reset(options={"split": "test", "index": 0})
    secret = env.unwrapped._current.answer
    assert obs[-1]["role"] == "user" and "between 1 and 100" in obs[-1]["content"]
    low = "<guess>0</guess>" if secret > 1 else "<guess>5</guess>"
    obs, r, term, trunc, info = env.step(low)
    assert obs == [{"role": "user", "content": "Higher." if secret > 1 else "Lower."}] and (r, term, trunc) == (0, False, False)
    obs, r, term, trunc, _ = env.step("no guess here")
    assert "<guess>N</guess>" in obs[0]["content"] and not term
    obs, r, term, trunc, info = env.step(f"I say <guess>{secret}</guess>")
    assert (obs, r, term, trunc, info["return"], info["correct"]) == ([], 1.0, True, False, 1.0, True)


def test_guess_number_runs_out_of_turns_and_bad_rows(tmp_path):
    env = gym.make("GuessNumber-v0", max_turns=2).unwrapped
    env.reset(options={"split": "test", "index": 1})
    wrong = "<guess>0</guess>"
    assert env.step(wrong)[2:4] == (False, False)
    _, r, term, trunc, info = env.step(wrong)
    assert (r, term, trunc, info["return"]) == (0.0, False, True, 0.0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(wrong)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"secret": 500}\n')
    with pytest.raises(llm_envs.DataError, match="row 0: field 'secret'"):
        gym.make("GuessNumber-v0", data={"test": str(bad)}).unwrapped.examples("test")
    with pytest.raises(ValueError, match="high"):
        gym.make("GuessNumber-v0", high=1)


def test_a_plain_completion_scores_as_the_first_turn():
    env = llm_envs.make("GuessNumber-v0")
    example = env.examples("test")[0]
    assert env.score(f"<guess>{example.answer}</guess>", example).reward == 1.0
    assert env.score("<guess>0</guess>", example).reward == 0.0


# ----- tools ----------------------------------------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


def broken(x: str) -> str:
    """Fail.

    Args:
        x: anything
    """
    raise ValueError("no good")


TOOLS = [tool(add), tool(slow), tool(broken)]


def test_tool_schema_comes_from_the_signature():
    schema = TOOLS[0].schema["function"]
    assert schema["name"] == "add" and schema["parameters"]["required"] == ["a", "b"]
    assert schema["parameters"]["properties"]["a"]["type"] == "integer"


@pytest.mark.parametrize("call, expected", [
    ('{"name": "add", "arguments": {"a": 2, "b": 3}}', "5"),
    ('{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}', "5"),
    ("not json", "error: malformed tool call: not JSON"),
    ('["add"]', "error: malformed tool call"),
    ('{"name": "sub", "arguments": {}}', "error: unknown tool 'sub'"),
    ('{"name": "add", "arguments": {"a": 2}}', "error: bad arguments for add: missing b"),
    ('{"name": "add", "arguments": {"a": 2, "b": "3"}}', "error: bad arguments for add: b must be integer"),
    ('{"name": "add", "arguments": {"a": 2, "b": 3, "c": 1}}', "error: bad arguments for add: unknown argument 'c'"),
    ('{"name": "broken", "arguments": {"x": "y"}}', "error: broken raised ValueError: no good"),
    ('{"name": "slow", "arguments": {"seconds": 30}}', "error: slow timed out after 0.3 s"),
])
def test_tool_calls_and_their_failures(call, expected):
    start = time.monotonic()
    out = run_tool_calls(f"thinking... <tool_call>{call}</tool_call>", TOOLS, timeout=0.3)
    assert time.monotonic() - start < 5
    assert out.calls == 1 and out.messages[0]["role"] == "tool"
    assert out.messages[0]["content"].startswith(expected)
    assert out.errors == expected.startswith("error:")


def test_unclosed_and_too_many_calls_are_errors():
    out = run_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}', TOOLS)
    assert (out.calls, out.errors) == (1, 1) and "without </tool_call>" in out.messages[0]["content"]
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    out = run_tool_calls(call * 3, TOOLS, max_calls=2)
    assert [m["content"] for m in out.messages][:2] == ["2", "2"] and out.errors == 1


class AdderEnv(MultiTurnEnv):
    """Say the sum of two numbers in <answer>; an ``add`` tool helps."""

    max_new_tokens = 16
    score_workers = 0
    max_turns = 3

    def build_split(self, split):
        return [Example(f"{split}-{i}", chat(f"What is {i} + 7? Answer in <answer></answer>."), i + 7)
                for i in range(3)]

    def tools(self):
        return TOOLS

    def respond(self, text, state, example):
        ok = f"<answer>{example.answer}</answer>" in text
        return Reply(reward=float(ok), done=True, correct=ok)


def test_a_tool_turn_then_an_answer_turn_through_gymnasium():
    env = AdderEnv()
    env.reset(options={"split": "test", "index": 2})
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 7}}</tool_call>')
    assert obs == [{"role": "tool", "name": "add", "content": "9"}] and not term and info["tool_calls"] == 1
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "nope"}</tool_call>')
    assert obs[0]["content"].startswith("error: unknown tool") and info["tool_errors"] == 1
    _, r, term, trunc, info = env.step("<answer>9</answer>")
    assert (r, term, info["return"], info["tool_calls"], info["tool_errors"]) == (1.0, True, 1.0, 2, 1)


def test_a_turn_that_hangs_ends_the_episode_in_bounded_time():
    class Hanging(AdderEnv):
        score_timeout = 0.5

        def respond(self, text, state, example):
            while True:
                pass

    env = Hanging()
    env.reset(options={"split": "test", "index": 0})
    start = time.monotonic()
    _, r, term, _, info = env.step("<answer>7</answer>")
    assert time.monotonic() - start < 5 and (r, term, info["error"]) == (0.0, True, "timeout")


# ----- the batched runner ----------------------------------------------------------------------------


def test_bridge_ids_are_the_templates_own_tokens(tiny_tokenizer):
    messages = [{"role": "user", "content": "Higher."}]
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}]
    full = tiny_tokenizer.apply_chat_template(convo + messages, tokenize=False, add_generation_prompt=True)
    head = tiny_tokenizer.apply_chat_template(convo, tokenize=False)
    cut = head.rfind("<|im_end|>") + len("<|im_end|>")
    assert tiny_tokenizer.decode(bridge_ids(tiny_tokenizer, messages)) == full[cut:]
    assert full[cut:].startswith("\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n")


def test_episodes_keep_exact_ids_and_mask_env_tokens(tiny_tokenizer):
    env = llm_envs.make("GuessNumber-v0", max_turns=3)
    examples = env.examples("test")[:2]
    engine = Scripted(tiny_tokenizer, ["<guess>0</guess>", "<guess>0</guess>", "<guess>0</guess>"])
    with llm_envs.BatchScorer(env, 0) as scorer:
        episodes = run_episodes(engine, scorer, examples, max_new_tokens=32)
    assert len(engine.calls) == 3  # one engine call per turn, both episodes in each
    first = encode_prompts(tiny_tokenizer, [e.prompt for e in examples])
    for k, ep in enumerate(episodes):
        assert ep.prompt_ids == first[k] and ep.turns == 3 and ep.truncated and not ep.terminated
        assert ep.episode_return == 0.0 and not ep.correct
        # what the engine was given at turn 3 is exactly the episode's ids so far
        assert engine.calls[2][k] == ep.prompt_ids + ep.ids[:len(engine.calls[2][k]) - len(ep.prompt_ids)]
        model = [t for t, m in zip(ep.ids, ep.mask) if m]
        env_side = [t for t, m in zip(ep.ids, ep.mask) if not m]
        sampled = tiny_tokenizer("<guess>0</guess>", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
        assert model == sampled * 3
        assert env_side == 2 * bridge_ids(tiny_tokenizer, [{"role": "user", "content": "Higher."}])
        # the env's reply to the last turn stays in the record, though the model never reads it
        assert [m["role"] for m in ep.messages] == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
        assert ep.messages[-1]["content"] in ("Higher.", "Lower.") and ep.cut is False


def test_finished_episodes_leave_the_batch(tiny_tokenizer):
    env = llm_envs.make("GuessNumber-v0", max_turns=4, test_size=5)
    examples = [e for e in env.examples("test")][:2]
    secret = examples[0].answer
    engine = Scripted(tiny_tokenizer, [f"<guess>{secret}</guess>", "<guess>0</guess>"])
    with llm_envs.BatchScorer(env, 0) as scorer:
        r = rollout(engine, scorer, examples, 32)
    assert [len(c) for c in engine.calls][:2] == [2, 1] or examples[1].answer == secret
    assert r.scores[0].reward == 1.0 and r.episodes[0].terminated and r.episodes[0].turns == 1
    assert r.mean_reward == sum(e.episode_return for e in r.episodes) / 2


def test_the_token_budget_truncates(tiny_tokenizer):
    class Tight(type(llm_envs.make("GuessNumber-v0"))):
        max_episode_tokens = 20

    env = Tight(max_turns=5)
    engine = Scripted(tiny_tokenizer, ["<guess>0</guess>"])
    with llm_envs.BatchScorer(env, 0) as scorer:
        [ep] = run_episodes(engine, scorer, env.examples("test")[:1], max_new_tokens=64)
    assert ep.truncated and ep.turns < 5 and len(ep.ids) <= 20


def test_a_rows_sampled_episode_depends_on_its_seed_alone(tiny_model, tiny_tokenizer):
    """Each row of a batch samples exactly what it samples alone, over several turns (its turns end
    at stop strings it writes), and rows with other seeds sample something else."""
    env = llm_envs.make("GuessNumber-v0", max_turns=3, stop_strings=list(" aeinost"))
    examples = env.examples("test")[:3]
    engine = make_engine("hf", tiny_model, tiny_tokenizer)
    with llm_envs.BatchScorer(env, 0) as scorer:
        both = run_episodes(engine, scorer, examples, 6, temperature=1.0, seed=[11, 22, 33])
        alone = [run_episodes(engine, scorer, examples[k:k + 1], 6, temperature=1.0, seed=[s])[0]
                 for k, s in enumerate([11, 22, 33])]
        other = run_episodes(engine, scorer, examples[1:2], 6, temperature=1.0, seed=[23])
    assert sum(ep.turns for ep in both) > 3  # several turns, so later turns' seeds are exercised
    for a, b in zip(alone, both):
        assert (a.ids, a.mask, a.turns) == (b.ids, b.mask, b.turns)
    assert other[0].ids != both[1].ids
    assert any(0 in ep.mask for ep in both)  # an env reply was stitched in
    # turn 0 draws from the row's seed, each later turn from one derived from (the row's seed, turn)
    assert turn_seed(22, 0) == 22 and len({turn_seed(s, t) for s in (11, 22) for t in (0, 1, 2)}) == 6


def test_lowrank_rows_stay_member_major_as_episodes_leave():
    pop = LowRankMembers([], [10, 20, 30], [1.0, -1.0, 1.0], 0.1, 1)
    rows, sub = _lowrank_call(pop, 9, [0, 2, 7])  # member 0: rows 0, 2; member 1: none; member 2: row 7
    assert rows == [0, 2, 7, 7] and list(sub.seeds) == [10, 30] and list(sub.signs) == [1.0, 1.0]
    assert sub.rows_per_member(len(rows)) == 2


def test_token_prompts_pass_through_every_engine(tiny_model, tiny_tokenizer):
    ids = encode_prompts(tiny_tokenizer, [chat("hello")])[0]
    assert encode_prompts(tiny_tokenizer, [TokenIds(ids)]) == [ids]
    for name in ("hf", "native"):
        engine = make_engine(name, copy.deepcopy(tiny_model), tiny_tokenizer)
        a = engine.generate([chat("hello")], max_new_tokens=6)
        b = engine.generate([TokenIds(ids)], max_new_tokens=6)
        assert a.token_ids == b.token_ids


def test_turn_examples_carry_no_opening():
    ex = llm_envs.make("Countdown-v0").examples("test")[0]
    assert ex.opening and TurnExample(ex.id, [], None, example=ex).opening == ""


class WorkerAdderEnv(AdderEnv):
    """AdderEnv scored in a worker process (killed at the deadline), its turns bounded there."""

    score_workers = 1
    score_timeout = 2.0
    tool_timeout = 0.3

    def respond(self, text, state, example):
        if "hang" in text:
            while True:
                pass
        return super().respond(text, state, example)


def test_turns_in_worker_processes_are_bounded_too(tiny_tokenizer):
    env = WorkerAdderEnv()
    examples = env.examples("test")[:2]
    slow = '<tool_call>{"name": "slow", "arguments": {"seconds": 60}}</tool_call>'
    with llm_envs.BatchScorer(env) as scorer:
        start = time.monotonic()
        [ep] = run_episodes(Scripted(tiny_tokenizer, [slow, "<answer>7</answer>"]), scorer, examples[:1], 400)
        assert (ep.tool_calls, ep.tool_errors, ep.episode_return, ep.turns) == (1, 1, 1.0, 2)
        assert "timed out" in ep.messages[-2]["content"]
        [ep] = run_episodes(Scripted(tiny_tokenizer, ["hang"]), scorer, examples[:1], 400)
        assert (ep.error, ep.terminated, ep.episode_return) == ("timeout", True, 0.0)
        assert time.monotonic() - start < 30


def test_bridge_ids_under_qwen25s_template(tiny_tokenizer):
    """Qwen2.5's template (as TRL ships it) renders tool results as a user turn of <tool_response> blocks."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("trl")
    path = Path(spec.origin).parent / "chat_templates" / "qwen2_5.jinja" if spec else None
    if path is None or not path.is_file():
        pytest.skip("needs trl's copy of Qwen2.5's chat template")
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = path.read_text()
    tools = [{"role": "tool", "name": "calculator", "content": "70"}, {"role": "tool", "name": "calculator", "content": "7"}]
    assert tok.decode(bridge_ids(tok, tools)) == ("\n<|im_start|>user\n<tool_response>\n70\n</tool_response>\n"
                                                   "<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


# ----- tools that see their episode; replies; options ---------------------------------------------------


def peek(position: int, state: dict, example: Example) -> str:
    """Reveal one character of the hidden answer.

    Args:
        position: which character, from 1
    """
    state["peeks"] += 1
    return f"{example.answer[position - 1]} (peek {state['peeks']})"


class HiddenEnv(MultiTurnEnv):
    """Say the hidden word; ``peek`` reveals its characters and is counted in the state."""

    max_new_tokens = 16
    score_workers = 0
    max_turns = 4

    def build_split(self, split):
        return [Example(f"{split}-{i}", chat("Say the hidden word."), word) for i, word in enumerate(["cat", "dog"])]

    def tools(self):
        return [tool(peek)]

    def begin(self, example):
        return {"peeks": 0}

    def respond(self, text, state, example):
        ok = text.strip() == example.answer
        return Reply(reward=float(ok) - 0.1 * state["peeks"], done=True, correct=ok, parts={"peeks": state["peeks"]})


def test_a_tool_reads_the_hidden_example_and_updates_the_episodes_state():
    schema = tool(peek).schema["function"]["parameters"]
    assert list(schema["properties"]) == ["position"] and schema["required"] == ["position"]  # state, example hidden
    env = HiddenEnv()
    env.reset(options={"split": "test", "index": 1})
    call = '<tool_call>{"name": "peek", "arguments": {"position": %d}}</tool_call>'
    obs, *_ = env.step(call % 1)
    assert obs == [{"role": "tool", "name": "peek", "content": "d (peek 1)"}]
    obs, *_ = env.step(call % 2)
    assert obs[0]["content"] == "o (peek 2)"  # the state carried over from the last turn
    obs, *_ = env.step('<tool_call>{"name": "peek", "arguments": {"position": 1, "state": {}}}</tool_call>')
    assert obs[0]["content"].startswith("error: bad arguments for peek: unknown argument 'state'")  # not the model's
    _, r, term, _, info = env.step("dog")
    assert term and info["correct"] and r == pytest.approx(0.8) and info["parts"] == {"peeks": 2}


def test_the_batched_runner_gives_tools_the_same_episode_state(tiny_tokenizer):
    call = '<tool_call>{"name": "peek", "arguments": {"position": 3}}</tool_call>'
    env = HiddenEnv()
    with llm_envs.BatchScorer(env, 0) as scorer:
        episodes = run_episodes(Scripted(tiny_tokenizer, [call, call, "cat"]), scorer, env.examples("test"), 64)
    assert [m["content"] for m in episodes[0].messages if m["role"] == "tool"] == ["t (peek 1)", "t (peek 2)"]
    assert [m["content"] for m in episodes[1].messages if m["role"] == "tool"] == ["g (peek 1)", "g (peek 2)"]
    assert episodes[0].episode_return == pytest.approx(0.8) and episodes[1].episode_return == pytest.approx(-0.2)
    assert (episodes[0].tool_calls, episodes[0].state) == (2, {"peeks": 2})


class Silent(HiddenEnv):
    """A reply that neither ends the episode nor says anything: an env bug."""

    def respond(self, text, state, example):
        return Reply(done=False, messages=[])


def test_a_reply_that_goes_on_without_a_message_is_an_error_in_step_and_in_the_runner(tiny_tokenizer):
    """D6: step continued the episode (the model asked to go on with nothing said) where the runner
    ended it with return 0: both now end it with the same error."""
    env = Silent()
    env.reset(options={"split": "test", "index": 0})
    _, r, term, trunc, info = env.step("cat")
    assert (r, term, trunc) == (0.0, True, False) and "must answer the model" in info["error"]
    with llm_envs.BatchScorer(env, 0) as scorer:
        [ep] = run_episodes(Scripted(tiny_tokenizer, ["cat"]), scorer, env.examples("test")[:1], 16)
    assert ep.terminated and ep.error == info["error"] and ep.episode_return == 0.0


def test_max_turns_and_stop_strings_are_options_of_every_multi_turn_env():
    for env_id, args in [("GuessNumber-v0", {}), ("Countdown-calc-v0", {}), ("Sudoku-feedback-v0", {}),
                         ("Retry-v0", {"env": "rg/basic_arithmetic-v0"})]:
        env = llm_envs.make(env_id, max_turns=3, stop_strings=["</x>"], **args)
        assert (env.max_turns, env.stop_strings) == (3, ("</x>",)), env_id
        assert llm_envs.make(env_id, **args).stop_strings  # each declares where its turns end
    env = HiddenEnv(max_turns=2, stop_strings=[])  # an author's env that never mentions them
    assert (env.max_turns, env.stop_strings, HiddenEnv.max_turns) == (2, (), 4)
    from trainers.common.config import ConfigError, make_env

    assert make_env("GuessNumber-v0", '{"max_turns": 3}').max_turns == 3
    with pytest.raises(ConfigError, match="max_turns must be an int >= 1"):
        make_env("Sudoku-feedback-v0", '{"max_turns": 0}')
    with pytest.raises(ValueError, match="name the same limit"):
        llm_envs.make("Sudoku-feedback-v0", attempts=2, max_turns=3)
    with pytest.raises(ValueError, match="stop_strings"):
        llm_envs.make("GuessNumber-v0", stop_strings="</guess>")


def test_the_check_command_steps_scripted_turns_and_fails_a_broken_env(capsys):
    import io

    from llm_envs import check

    out = io.StringIO()
    assert check.main(["GuessNumber-v0"], out) == 0
    text = out.getvalue()
    assert "stop strings '</guess>'" in text and "-> reward 1, terminated, correct" in text
    assert "user: I could not read a guess" in text and "ok: the good reply solves the episode" in text
    out = io.StringIO()
    assert check.main(["tests.test_multiturn:Silent-v0"], out) == 1  # respond never answers: an env bug
    text = out.getvalue()
    assert "FAIL: malformed reply: turn 1 could not be processed: ValueError: Silent.respond returned" in text
    assert "warning: no stop strings" in text and "the env defines no good_reply" in text
    with pytest.raises(SystemExit):
        check.main(["GuessNumber-v0", "--env-args", '{"max_turns": 0}'], io.StringIO())
    assert "max_turns must be an int >= 1" in capsys.readouterr().err


def test_the_check_samples_episodes_of_a_model_as_training_runs_them(tiny_model_dir):
    import io

    from llm_envs import check

    out = io.StringIO()
    assert check.main(["GuessNumber-v0", "--env-args", '{"max_turns": 2}', "--model", str(tiny_model_dir),
                       "--episodes", "3", "--max-new-tokens", "4", "--engine", "hf"], out) == 0
    text = out.getvalue()
    assert "== 3 episodes of" in text and "(engine hf, temperature 1, seed 0, max_new_tokens 4)" in text
    episodes = [line for line in text.splitlines() if line.startswith("-- episode ")]
    assert len(episodes) == 3 and all("1 turn(s)" in e and "last turn cut at the token limit" in e for e in episodes)
    assert "means: turns_mean 1.00, tool_calls_mean 0.00" in text
    assert "warning: 3 of 3 episodes ended at their first turn, cut at 4 new tokens" in text  # the tiny model rambles


llm_envs.register("Silent-v0", Silent)
