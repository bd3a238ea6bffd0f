"""``python -m llm_envs.check ENV``: see an environment work before training on it.

Steps scripted turns through the env's own Gymnasium API, on the first example of a split, and
prints each turn (cut at the env's stop strings, as generation would cut it), the env's reply, the
reward and the flags:

- **good**: the env's ``good_reply(example)`` (a turn that solves it), when the env defines one;
- **malformed**: a turn with no answer in it, then the good reply;
- **tool**: for each tool, a call with arguments of the schema's types, then the good reply; and
  a malformed call (not JSON).

Then the checks, one line each (``FAIL``: exit code 1): a turn the env could not process (its
``respond`` or scorer raised: ``info["error"]``), a good reply not rewarded as solved, a tool an
env offers without naming it in its prompt, a multi-turn env without stop strings or with tools but
no ``</tool_call>`` stop string (turns then run on to the token limit).

``--model MODEL`` also samples a few episodes (``--episodes``, at ``--temperature``) with the
trainers' batched runner, exactly as ES, GRPO, PPO and eval run them, and prints each one's
conversation, turns, tool calls, how it ended and its return, then their means and the warning
a trainer would print when most of them end cut at their first turn.

    python -m llm_envs.check GuessNumber-v0
    python -m llm_envs.check my_envs:BullsAndCows-v0 --env-args '{"max_turns": 3}' --model smollm2-135m

ENV is any registered id; ``module:Env-v0`` imports ``module`` first (run from the folder that holds
it, as ``python -m`` puts the current folder on the path).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import llm_envs
from llm_envs.core import TaskEnv
from llm_envs.multiturn import MultiTurnEnv
from llm_envs.registry import UnknownEnvError
from llm_envs.tools import Tool

#: A turn with nothing an env can read in it.
MALFORMED = "I am not sure."
#: A tool call that is not JSON.
BAD_CALL = "<tool_call>{not json}</tool_call>"
#: Characters of a message shown per line.
SHOWN = 300
_SAMPLE_VALUES = {"integer": 1, "number": 1.0, "string": "1", "boolean": True, "array": [], "object": {}}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _short(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= SHOWN else text[:SHOWN] + f"... ({len(text)} characters)"


def cut_at_stop_strings(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to and including the first stop string it holds, as generation would end the turn."""
    ends = [k + len(s) for s in stop_strings if (k := text.find(s)) >= 0]
    return text[:min(ends)] if ends else text


def sample_call(t: Tool) -> str:
    """A call of ``t`` with a value of each parameter's JSON type (``1``, ``"1"``, ...)."""
    properties = t.parameters.get("properties", {})
    arguments = {}
    for name, spec in properties.items():
        kind = spec.get("type")
        kind = kind[0] if isinstance(kind, list) and kind else kind
        arguments[name] = spec["enum"][0] if spec.get("enum") else _SAMPLE_VALUES.get(kind, "1")
    return f'<tool_call>{json.dumps({"name": t.name, "arguments": arguments})}</tool_call>'


class Report:
    """What the check found: lines of ``ok``, ``warning`` and ``FAIL``."""

    def __init__(self):
        self.lines: list[str] = []
        self.failed = False

    def ok(self, text: str) -> None:
        self.lines.append(f"  ok: {text}")

    def warn(self, text: str) -> None:
        self.lines.append(f"  warning: {text}")

    def fail(self, text: str) -> None:
        self.lines.append(f"  FAIL: {text}")
        self.failed = True


def describe(env: TaskEnv) -> str:
    """One line: the env's kind, limits, stop strings and tools."""
    strings = ", ".join(map(repr, env.stop_strings)) or "none"
    if not isinstance(env, MultiTurnEnv):
        return f"single-turn; max_new_tokens {env.max_new_tokens}; stop strings {strings}"
    tools = ", ".join(t.name for t in env.tools()) or "none"
    return (f"multi-turn: max_turns {env.max_turns}, max_new_tokens {env.max_new_tokens} per turn, "
            f"episode budget {env.episode_tokens()} tokens; stop strings {strings}; tools {tools}")


def play(env: TaskEnv, split: str, index: int, turns: list[str], name: str, report: Report, out) -> dict[str, Any]:
    """Step ``turns`` (each cut at the stop strings) through a fresh episode, printing each; returns
    the last step's info (with ``reward``, ``terminated``, ``truncated``)."""
    print(f"-- {name}", file=out)
    env.reset(options={"split": split, "index": index})
    info: dict[str, Any] = {}
    for k, text in enumerate(turns):
        sent = cut_at_stop_strings(text, env.stop_strings)
        cut = "" if sent == text else f"   (cut at a stop string; {len(text) - len(sent)} characters dropped)"
        print(f"  turn {k + 1}  assistant: {_short(sent)}{cut}", file=out)
        messages, reward, terminated, truncated, info = env.step(sent)
        for m in (messages if isinstance(messages, list) else []):
            who = m["role"] + (f" {m['name']}" if m.get("name") else "")
            print(f"           {who}: {_short(m['content'])}", file=out)
        flags = [f for f, on in (("terminated", terminated), ("truncated", truncated),
                                  ("correct", info.get("correct"))) if on]
        extra = f", error {info['error']!r}" if info.get("error") else ""
        calls = f", tool calls {info['tool_calls']} (errors {info['tool_errors']})" if "tool_calls" in info else ""
        print(f"           -> reward {reward:g}{', ' + ', '.join(flags) if flags else ''}{calls}{extra}", file=out)
        if info.get("error"):
            report.fail(f"{name}: turn {k + 1} could not be processed: {info['error']}")
        info = dict(info, reward=reward, terminated=terminated, truncated=truncated)
        if terminated or truncated:
            break
    return info


def scripted(env: TaskEnv, split: str, index: int, report: Report, out) -> None:
    """The scripted turns and the checks on them (module docstring)."""
    example = env.examples(split)[index]
    good = env.good_reply(example)
    multi = isinstance(env, MultiTurnEnv)
    if good is None:
        report.warn("the env defines no good_reply(example), so no solving turn was stepped "
                    "(define it to see the reward of a solved episode)")
    else:
        info = play(env, split, index, [good], "good reply (the env's good_reply)", report, out)
        if info.get("correct") and (info["terminated"] or not multi):
            report.ok(f"the good reply solves the episode (reward {info['reward']:g})")
        elif not info.get("error"):
            report.fail("the env's good_reply is not scored as correct" + (" and ending the episode" if multi else ""))
        if cut_at_stop_strings(good, env.stop_strings) != good:
            report.warn("good_reply holds a stop string before its end: generation would end the turn there")
    info = play(env, split, index, [MALFORMED] + ([good] if good and multi else []),
                "malformed reply" + (", then the good reply" if good and multi else ""), report, out)
    if not info.get("error"):
        report.ok("a malformed reply is processed without an error")
    if not multi:
        return
    tools = list(env.tools())
    prompt_text = " ".join(m["content"] for m in example.prompt)
    for t in tools:
        play(env, split, index, [sample_call(t)] + ([good] if good else []),
             f"tool {t.name}" + (", then the good reply" if good else ""), report, out)
        if t.name not in prompt_text:
            report.warn(f"the first prompt never names the tool {t.name!r}: the model is not told it exists "
                        f"(put llm_envs.tool_prompt(tools) in the system message)")
    if tools:
        info = play(env, split, index, [BAD_CALL], "a malformed tool call", report, out)
        if info.get("tool_errors"):
            report.ok("a malformed tool call is answered with an error message")
        if "</tool_call>" not in env.stop_strings:
            report.warn("the env has tools but '</tool_call>' is not a stop string: a turn that calls one goes on "
                        "to the token limit")
    if not env.stop_strings:
        report.warn("no stop strings: a turn ends only at the model's end-of-turn token or the token limit "
                    "(small models rarely write it; set stop_strings, e.g. ('</answer>',))")


def sampled(env: TaskEnv, split: str, args, out) -> None:
    """A few episodes (or completions) of ``args.model``, run as the trainers run them."""
    from trainers.common.episodes import EpisodeTally, cut_short, episode_row
    from trainers.common.models import load_model
    from trainers.common.rollout import rollout
    from trainers.engines import make_engine

    model, tokenizer = load_model(args.model, dtype=args.dtype)
    engine = make_engine(args.engine, model, tokenizer)
    max_new = args.max_new_tokens or env.max_new_tokens
    examples = list(env.examples(split))[args.index:args.index + args.episodes]
    temperature = args.temperature
    print(f"\n== {len(examples)} {'episodes' if isinstance(env, MultiTurnEnv) else 'completions'} of {args.model} "
          f"(engine {engine.name}, {'greedy' if temperature == 0 else f'temperature {temperature:g}, seed {args.seed}'}, "
          f"max_new_tokens {max_new})", file=out)
    with llm_envs.BatchScorer(env) as scorer:
        r = rollout(engine, scorer, examples, max_new, temperature=temperature,
                    seed=args.seed if temperature > 0 else None)
    engine.close()
    if r.episodes is None:
        for k, (text, score) in enumerate(zip(r.texts, r.scores)):
            print(f"-- completion {k + 1}: {_short(text)}\n   -> reward {score.reward:g}"
                  f"{', correct' if score.correct else ''}", file=out)
        return
    tally = EpisodeTally()
    for k, ep in enumerate(r.episodes):
        row = episode_row(ep)
        tally.add([row])
        end = "terminated" if ep.terminated else "truncated" if ep.truncated else "?"
        end += " (last turn cut at the token limit)" if ep.cut else ""
        print(f"-- episode {k + 1}: {ep.turns} turn(s), tool calls {ep.tool_calls} (errors {ep.tool_errors}), {end}, "
              f"return {ep.episode_return:g}{', correct' if ep.correct else ''}", file=out)
        for m in ep.messages[len(ep.example.prompt) - (1 if ep.example.opening else 0):]:
            who = m["role"] + (f" {m['name']}" if m.get("name") else "")
            print(f"     {who}: {_short(m['content'])}", file=out)
    means = tally.means()
    print("means: " + ", ".join(f"{k} {v:.2f}" for k, v in means.items()), file=out)
    warning = cut_short(tally, max_new, env.stop_strings, None)
    if warning:
        print(warning, file=out)


def main(argv: Sequence[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    parser = _Parser(prog="python -m llm_envs.check", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("env", metavar="ENV", help="env id, or module:Env-v0 (imports module first)")
    parser.add_argument("--env-args", help="JSON object of the env's options, e.g. '{\"max_turns\": 3}'")
    parser.add_argument("--split", default=None, help="split of the examples (default: the env's first eval split)")
    parser.add_argument("--index", type=int, default=0, help="the example the scripted turns play")
    parser.add_argument("--model", help="also sample episodes of this model (HF id, local dir, smollm2-135m)")
    parser.add_argument("--episodes", type=int, default=4, help="with --model: episodes (examples from --index on)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="with --model: per turn (default: the env's)")
    parser.add_argument("--temperature", type=float, default=1.0, help="with --model: 0 = greedy")
    parser.add_argument("--seed", type=int, default=0, help="with --model: sampling seed")
    parser.add_argument("--engine", default="auto", help="with --model: generation engine (auto, hf, native, vllm)")
    parser.add_argument("--dtype", default="auto", help="with --model: auto, fp32 or bf16")
    args = parser.parse_args(argv)
    try:
        options = json.loads(args.env_args) if args.env_args else {}
        if not isinstance(options, dict):
            raise ValueError("must be a JSON object")
    except ValueError as exc:
        parser.error(f"--env-args: {exc}")
    try:
        env = llm_envs.make(args.env, **options)
    except UnknownEnvError as exc:
        parser.error(str(exc))
    except (TypeError, ValueError) as exc:
        parser.error(f"--env-args: {exc}")
    split = args.split or env.eval_splits[0]
    try:
        examples = env.examples(split)
    except (KeyError, llm_envs.DataError) as exc:
        parser.error(f"--split: {exc}")
    if not 0 <= args.index < len(examples):
        parser.error(f"--index {args.index}: split {split!r} has {len(examples)} examples")
    print(f"{args.env}: {describe(env)}", file=out)
    print(f"first prompt ({split} example {args.index}, id {examples[args.index].id}):", file=out)
    for m in examples[args.index].prompt:
        print(f"  [{m['role']}] {_short(m['content'])}", file=out)
    report = Report()
    scripted(env, split, args.index, report, out)
    print("checks:", file=out)
    print("\n".join(report.lines), file=out)
    if args.model:
        sampled(env, split, args, out)
    env.close()
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
