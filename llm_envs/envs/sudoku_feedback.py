"""4x4 Sudoku with feedback: Sudoku-v0's puzzles, over up to ``attempts`` turns (a multi-turn env,
``llm_envs.multiturn``).

Each assistant turn is an attempt, read as Sudoku-v0 reads a completion (the last ``<answer>``
block); a turn ends at ``</answer>`` (``stop_strings``). A solved grid ends the episode. Otherwise the env names what is wrong and the model tries
again: an unreadable grid ("could not read a 4x4 grid ..."), the givens it changed, and the rows,
columns and 2x2 boxes that do not hold 1-4 exactly once (rows and columns numbered from 1, boxes
named top-left, top-right, bottom-left, bottom-right). The feedback never reveals a cell's value.

Reward: the episode's final reward is Sudoku-v0's reward of its last attempt (``reward=``
``"partial"`` or ``"binary"``, as Sudoku-v0), given on the turn that ends it: the solving attempt,
or the ``attempts``-th. ``attempt_reward`` (default 0) adds, on every attempt that does not end the
episode, that weight times the fraction of the 12 rows, columns and boxes it got right: optional
per-turn shaping. ``correct`` is Sudoku-v0's strict check of the last attempt.

An episode cut before its last attempt (``max_new_tokens`` without a stop token, the token budget)
keeps only the shaping of the attempts it made. Data, splits and options are Sudoku-v0's.
"""

from __future__ import annotations

from typing import Any

from llm_envs.envs.sudoku import _UNITS, SudokuEnv, keeps_givens, parse_answer, unit_ok
from llm_envs.multiturn import MultiTurnEnv, Reply, turn_limit
from llm_envs.parsing import last_tag
from llm_envs.registry import register
from llm_envs.types import Example

_BOXES = ("top-left", "top-right", "bottom-left", "bottom-right")


def conflicts(grid: list[list[int]]) -> list[str]:
    """The rows, columns and boxes of ``grid`` that do not hold 1-4 exactly once, named."""
    names = [f"row {i + 1}" for i in range(4)] + [f"column {i + 1}" for i in range(4)] + [f"{b} box" for b in _BOXES]
    return [name for name, unit in zip(names, _UNITS) if not unit_ok(grid, unit)]


def feedback(text: str, puzzle: list[list[int]]) -> str:
    """What is wrong with the attempt ``text`` (whose grid is not a solution)."""
    block = last_tag(text, "answer")
    grid = parse_answer(block) if block is not None else None
    if grid is None:
        return ("I could not read a 4x4 grid in your <answer></answer> block: write four rows of four numbers "
                "separated by spaces. Try again.")
    problems = []
    if not keeps_givens(grid, puzzle):
        changed = [f"row {r + 1} column {c + 1}" for r in range(4) for c in range(4)
                   if puzzle[r][c] and puzzle[r][c] != grid[r][c]]
        problems.append("you changed the given numbers at " + ", ".join(changed))
    bad = conflicts(grid)
    if bad:
        problems.append("these do not hold 1-4 exactly once: " + ", ".join(bad))
    return "Not solved: " + "; ".join(problems) + ". Try again."


class SudokuFeedbackEnv(MultiTurnEnv, SudokuEnv):
    """Sudoku-v0 over up to ``attempts`` attempts, the env naming conflicts after each (multi-turn).

    Args: Sudoku-v0's, ``attempts`` (turns an episode may take; ``max_turns`` is the same option)
    and ``attempt_reward`` (the weight of the optional per-attempt shaping).
    """

    max_turns = 3
    stop_strings = ("</answer>",)

    def __init__(self, *args: Any, attempts: int | None = None, attempt_reward: float = 0.0,
                 max_turns: int | None = None, **kwargs: Any):
        if not 0 <= attempt_reward <= 1:
            raise ValueError(f"attempt_reward must be in [0, 1], got {attempt_reward}")
        super().__init__(*args, max_turns=turn_limit(attempts, max_turns, 3), **kwargs)
        self.attempt_reward = float(attempt_reward)

    def begin(self, example: Example) -> dict[str, int]:
        return {"attempts": 0}

    def respond(self, text: str, state: dict[str, int], example: Example) -> Reply:
        state["attempts"] += 1
        score = SudokuEnv.score_completion(self, text, example)
        if score.correct or state["attempts"] >= self.max_turns:
            return Reply(reward=score.reward, done=True, correct=score.correct, parts=score.parts)
        return Reply([{"role": "user", "content": feedback(text, example.meta["puzzle"])}],
                     reward=self.attempt_reward * score.parts["units"], parts=score.parts)


register("Sudoku-feedback-v0", SudokuFeedbackEnv)
