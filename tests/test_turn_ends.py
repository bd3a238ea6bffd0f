"""Turns that end (issue 56): per-env stop strings in every engine (hf, native eager and at fixed
shapes, vllm where installed), cut by one rule; and the batched runner's stitching of turns: the
template's end-of-turn closing a turn that stopped otherwise (D4), the bridge under a template whose
marker holds an "x" (D3), the run's token budget (D8), the env's last reply in the record."""

from __future__ import annotations

import copy
import importlib.util

import pytest

import llm_envs
from llm_envs import Example, MultiTurnEnv, Reply, chat
from tests.test_multiturn import Scripted
from trainers.common.episodes import bridge_ids, closing_ids, run_episodes
from trainers.common.rollout import rollout
from trainers.engines import make_engine
from trainers.engines.generation import GenerationResult, StopStrings, encode_prompts
from trainers.engines.native import NativeEngine

PROMPTS = [chat("What is the capital of France?"), chat("Solve the puzzle."), chat("the a an of to in"),
           chat("Sudoku grid rows")]


def test_the_cut_is_the_shortest_run_of_tokens_holding_the_string(tiny_tokenizer):
    strings = StopStrings(tiny_tokenizer, ["</guess>", "</tool_call>"])
    ids = tiny_tokenizer("I say <guess>42</guess> and more </tool_call> text", add_special_tokens=False)["input_ids"]
    cut_ids, text = strings.cut(ids)
    assert text == "I say <guess>42</guess>"  # the text ends at the first string to be completed
    decoded = tiny_tokenizer.decode(cut_ids)
    assert decoded.startswith(text) and "</guess>" not in tiny_tokenizer.decode(cut_ids[:-1])  # nothing shorter holds it
    assert strings.hit(cut_ids) and not strings.hit(cut_ids[:-1])
    assert strings.cut(ids[:3]) is None and StopStrings(tiny_tokenizer).cut(ids) is None
    with pytest.raises(ValueError, match="stop_strings"):
        StopStrings(tiny_tokenizer, "</guess>")  # a string, not a list of them


def _forwards(model):
    """A counter of the model's forward passes (each decode step is one)."""
    count = {"n": 0}

    def hook(*_):
        count["n"] += 1

    return count, model.model.embed_tokens.register_forward_pre_hook(hook)  # hf and native both embed each step


ENGINES = ["hf", "native", "native-fixed"] + (["vllm"] if importlib.util.find_spec("vllm") else [])


@pytest.fixture(scope="module")
def stop_model(tiny_tokenizer):
    from tests.conftest import build_tiny_model

    return build_tiny_model(tiny_tokenizer, head_dim=32)  # a head size vLLM's CPU attention supports


def _engine(name, model, tokenizer):
    if name == "native-fixed":
        return NativeEngine(model, tokenizer, fixed_shapes=True)
    return make_engine(name, model, tokenizer)


def _strings_of(texts: list[str]) -> list[str]:
    """Three characters each of the first rows' greedy texts write after their first letter: strings
    these rows hit mid-completion (and every engine, being greedy alike, writes them too)."""
    out = []
    for text in texts:
        k = next(i for i, ch in enumerate(text) if ch.isascii() and ch.isalpha())
        out.append(text[k:k + 3])
    return out


def _expected(text: str, strings: list[str]) -> tuple[str, bool]:
    ends = [text.find(x) + len(x) for x in strings if x in text]
    return (text[:min(ends)], True) if ends else (text, False)


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_ends_a_turn_at_a_stop_string_the_same_way(name, stop_model, tiny_tokenizer):
    hf = make_engine("hf", stop_model, tiny_tokenizer)
    reference = hf.generate(PROMPTS, 16)
    strings = _strings_of(reference.texts[:3])  # the last prompt's row writes none of them: it runs to the limit
    expected = [_expected(t, strings) for t in reference.texts]
    assert [done for _, done in expected] == [True, True, True, False]
    engine = _engine(name, stop_model, tiny_tokenizer)
    try:
        out = engine.generate(PROMPTS, 16, stop_strings=strings)
        count, hook = _forwards(stop_model)
        try:
            engine.generate(PROMPTS[:3], 16, stop_strings=strings)
        finally:
            hook.remove()
    finally:
        engine.close()
    assert list(zip(out.texts, out.finished)) == expected  # the turn is its text up to and including the string
    for ids, full, (text, done) in zip(out.token_ids, reference.token_ids, expected):
        assert ids == full[:len(ids)] and (len(ids) < len(full)) == done  # the sampled ids, cut
        assert done <= (text in tiny_tokenizer.decode(ids))
    assert out.token_ids == hf.generate(PROMPTS, 16, stop_strings=strings).token_ids
    if name != "vllm":  # the rows left when they hit a string: far fewer than 16 decode steps
        assert count["n"] < 16


def test_rollouts_cut_an_envs_turns_at_its_stop_strings(tiny_model, tiny_tokenizer):
    text = make_engine("hf", tiny_model, tiny_tokenizer).generate([chat("Say 0.")], 8).texts[0]

    class Stopped(type(llm_envs.make("toy_envs:CheapEcho-v0"))):
        stop_strings = (text[2:4],)

    env = Stopped()
    with llm_envs.BatchScorer(env, 0) as scorer:
        r = rollout(make_engine("native", tiny_model, tiny_tokenizer), scorer, env.examples("test")[:1], 8)
    assert r.texts[0] == text[:text.find(text[2:4]) + 2] and r.generation.finished[0]


# ----- stitching turns ----------------------------------------------------------------------------------


class Stopping(Scripted):
    """A scripted engine whose turns end as an engine ends them at ``stop``: on that token, or (None)
    at a stop string, the ids holding no stop token."""

    def __init__(self, tokenizer, turns, stop: int | None):
        super().__init__(tokenizer, turns)
        self.stop = stop

    def generate(self, prompts, max_new_tokens=64, **kwargs):
        self.calls.append([list(p) for p in prompts])
        text = self.turns[min(len(self.calls) - 1, len(self.turns) - 1)]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + ([self.stop] if self.stop is not None else [])
        n = len(prompts)
        return GenerationResult([text] * n, [len(ids)] * n, [True] * n, [list(ids)] * n, [1] * n, 0.0)


@pytest.mark.parametrize("stop", ["<|endoftext|>", None], ids=["another-stop-token", "stop-string"])
def test_a_turn_that_stopped_otherwise_is_closed_with_the_templates_end_of_turn(stop, tiny_tokenizer):
    """D4: SmolLM2 stops on <|endoftext|> too, and a stop string leaves no stop token: either way the
    conversation the model trains on must close the turn with <|im_end|> (masked 0), as the template does."""
    env = llm_envs.make("GuessNumber-v0", max_turns=2)
    stop_id = tiny_tokenizer.convert_tokens_to_ids(stop) if stop else None
    engine = Stopping(tiny_tokenizer, ["<guess>0</guess>"], stop_id)
    with llm_envs.BatchScorer(env, 0) as scorer:
        [ep] = run_episodes(engine, scorer, env.examples("test")[:1], 16)
    sampled = tiny_tokenizer("<guess>0</guess>", add_special_tokens=False)["input_ids"] + ([stop_id] if stop else [])
    closer = closing_ids(tiny_tokenizer)
    assert tiny_tokenizer.decode(closer) == "<|im_end|>"
    bridge = bridge_ids(tiny_tokenizer, [{"role": "user", "content": "Higher." if ep.example.answer > 0 else "Lower."}])
    assert ep.ids[:len(sampled) + len(closer) + len(bridge)] == sampled + closer + bridge
    assert ep.mask[:len(sampled) + len(closer)] == [1] * len(sampled) + [0] * len(closer)
    # a turn that ended on the template's own token gets nothing more
    with llm_envs.BatchScorer(env, 0) as scorer:
        [plain] = run_episodes(Stopping(tiny_tokenizer, ["<guess>0</guess>"], tiny_tokenizer.eos_token_id), scorer,
                               env.examples("test")[:1], 16)
    own = tiny_tokenizer("<guess>0</guess>", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert plain.ids[:len(own) + len(bridge)] == own + bridge


ENDOFTEXT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_the_bridge_under_a_template_whose_marker_holds_an_x(tiny_tokenizer):
    """D3: a one-letter dummy reply "x" was found inside "<|endoftext|>", and the bridge began "t|>"."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ENDOFTEXT_TEMPLATE
    bridge = tok.decode(bridge_ids(tok, [{"role": "user", "content": "Higher."}]))
    assert bridge == "\n<|user|>\nHigher.<|endoftext|>\n<|assistant|>\n"
    assert tok.decode(closing_ids(tok)) == "<|endoftext|>"


class Chatty(MultiTurnEnv):
    """Replies with a long message, and a last word when the episode ends."""

    max_new_tokens = 512  # the env's default per-turn budget: the run asks for far fewer
    max_turns = 3
    score_workers = 0

    def build_split(self, split):
        return [Example(f"{split}-0", chat("Talk."), None)]

    def respond(self, text, state, example):
        return Reply([{"role": "user", "content": "the " * 400}])


def test_the_episode_budget_follows_the_runs_max_new_tokens(tiny_tokenizer):
    """D8: the budget is max_turns x (the run's max_new_tokens + 256), not the env's 512 per turn:
    two 400-word replies do not fit 3 x (4 + 256) tokens, so the episode is truncated at turn 2."""
    env = Chatty()
    assert env.episode_tokens(4) == 3 * (4 + 256) and env.episode_tokens() == 3 * (512 + 256)
    with llm_envs.BatchScorer(env, 0) as scorer:
        [ep] = run_episodes(Scripted(tiny_tokenizer, ["hi"]), scorer, env.examples("test"), 4)
    assert (ep.turns, ep.truncated) == (2, True) and len(ep.ids) <= env.episode_tokens(4)
    # the env's reply to the last turn stays in the record, not in the ids
    assert ep.messages[-1] == {"role": "user", "content": "the " * 400} and ep.messages[-2]["role"] == "assistant"


# ----- sizes and normalisers of episodes (D8), the warning --------------------------------------------


def test_es_sizes_its_rows_by_the_whole_episode(tiny_model, tiny_tokenizer, monkeypatch):
    """D8: the hf engine's rows of a low-rank population were sized by the first turn only; an
    episode's row grows by its whole token budget (turns and the env's replies)."""
    import numpy as np

    from trainers.common.config import build_config
    from trainers.engines.hf import HFEngine
    from trainers.es import train as es
    from trainers.es.noise import lowrank

    sized = []
    monkeypatch.setattr(es, "rows_that_fit", lambda model, tokens: sized.append(tokens) or 64)
    env = llm_envs.make("GuessNumber-v0", max_turns=2)
    cfg = build_config(es.ESConfig, {"env": "GuessNumber-v0", "population": 2, "noise": "lowrank", "max_new_tokens": 4})
    batch = env.examples("train")[:2]
    longest = max(len(ids) for ids in encode_prompts(tiny_tokenizer, [e.prompt for e in batch]))
    arrays = [np.zeros(2) for _ in range(3)]
    with llm_envs.BatchScorer(env, 0) as scorer:
        es.evaluate_batched(cfg, HFEngine(copy.deepcopy(tiny_model), tiny_tokenizer), scorer,
                            lowrank.select_layers(tiny_model, None, 1), batch, [(0, 1, 1.0), (1, 2, 1.0)], *arrays)
    assert sized == [longest + env.episode_tokens(4)] and env.episode_tokens(4) == 2 * (4 + 256)


def test_trainers_warn_once_when_most_episodes_end_cut_at_their_first_turn(tiny_model_dir, tmp_path, capsys):
    """Without stop strings the tiny model never ends a turn in 4 tokens: every episode is one turn
    cut at the limit. ES says so once, in one line naming the check; with stop strings it writes,
    its turns end and nothing is said."""
    from trainers.es import train as es

    common = ["--env", "GuessNumber-v0", "--model", str(tiny_model_dir), "--max-new-tokens", "4", "--eval-every",
              "0", "--eval-limit", "2", "--iterations", "2", "--population", "2", "--batch-size", "2", "--dtype", "fp32"]
    es.main([*common, "--env-args", '{"stop_strings": [], "max_turns": 3}', "--out", str(tmp_path / "cut")])
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if "warning:" in x]
    held_out, training = lines  # once each, not per iteration or evaluation
    assert held_out.startswith("[iter 0] held-out: warning: 2 of 2 episodes ended at their first turn, cut at 4 new")
    assert training.startswith("[iter 1] warning: 4 of 4 episodes")  # 2 members x 2 prompts
    assert "(the env has no stop strings)" in training
    assert "python -m llm_envs.check GuessNumber-v0 --env-args" in training and "--max-new-tokens 4" in training
    es.main([*common, "--env-args", '{"stop_strings": [" ", "a", "e", "i", "o", "s", "t", "n"], "max_turns": 3}',
             "--out", str(tmp_path / "ends")])
    assert "warning:" not in capsys.readouterr().out
