"""Countdown with a calculator: Countdown-v0's puzzles and reward, over several turns, with a
``calculator`` tool (a multi-turn env, ``llm_envs.multiturn``).

The prompt is Countdown-v0's plus the tool's description in the system message (``tool_prompt``:
the Qwen/Hermes ``<tool_call>{json}</tool_call>`` format). A turn that calls the calculator gets
the result as a ``tool`` message (an unreadable expression, a wrong call, ... an ``error:`` message)
and the model goes on; the first turn without a tool call is the answer, scored exactly as
Countdown-v0 scores a completion (``0.1 * format + answer``; the first turn continues the paper's
opening, so the opening counts as there, later turns are checked whole). ``max_turns`` (default 4)
bounds the episode: one that uses every turn on tool calls returns 0. A turn ends at
``</tool_call>`` or ``</answer>`` (``stop_strings``).

The calculator evaluates ``+ - * /`` and parentheses over non-negative integers with Countdown's
own ``ast`` walk (``evaluate_expression``: exact fractions, never ``eval``); it does not check
which numbers are used, the answer does. Data, splits and options are Countdown-v0's.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from llm_envs.envs.countdown import PAPER_SYSTEM_PROMPT, CountdownEnv, ExpressionError, evaluate_expression
from llm_envs.multiturn import MultiTurnEnv, Reply
from llm_envs.registry import register
from llm_envs.tools import Tool, tool_prompt
from llm_envs.types import Example


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: non-negative integers with + - * / and parentheses, e.g. "(25 - 5) * 4"
    """
    try:
        value, _ = evaluate_expression(expression.replace("×", "*").replace("÷", "/").replace("−", "-"))
    except ExpressionError as exc:
        return f"error: {exc}"
    return _show(value)


def _show(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator} (= {float(value):.6g})"


#: The calculator as a tool: ``tool(calculator)``'s schema, written out so that ``import llm_envs``
#: does not import transformers (a test checks the two agree).
CALCULATOR = Tool("calculator", calculator, {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": 'non-negative integers with + - * / and parentheses, e.g. "(25 - 5) * 4"'}},
        "required": ["expression"]},
    "return": {"type": "string"}}})


class CountdownCalcEnv(MultiTurnEnv, CountdownEnv):
    """Countdown-v0 over several turns, with a ``calculator`` tool (multi-turn; see the module docstring).

    Args: Countdown-v0's, and ``max_turns`` (turns an episode may take, tool turns included).
    """

    max_turns = 4
    max_new_tokens = 256
    stop_strings = ("</tool_call>", "</answer>")

    def __init__(self, *args: Any, system_prompt: str | None = PAPER_SYSTEM_PROMPT, **kwargs: Any):
        system = ((system_prompt + "\n\n") if system_prompt else "") + tool_prompt([CALCULATOR])
        super().__init__(*args, system_prompt=system, **kwargs)

    def tools(self) -> list[Tool]:
        return [CALCULATOR]

    def respond(self, text: str, state: Any, example: Example) -> Reply:
        score = CountdownEnv.score_completion(self, text, example)
        return Reply(reward=score.reward, done=True, correct=score.correct, parts=score.parts)


register("Countdown-calc-v0", CountdownCalcEnv)
