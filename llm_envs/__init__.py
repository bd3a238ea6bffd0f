"""llm-envs: task environments with verifiable rewards, registered with Gymnasium: single-turn,
and multi-turn with tools (``MultiTurnEnv``, ``llm_envs.multiturn``).

``import llm_envs`` registers five single-turn environments, Countdown-v0, Conciseness-v0, MATH-v0,
Sudoku-v0 and ARC-AGI-v0, four multi-turn ones, GuessNumber-v0, Countdown-calc-v0,
Sudoku-feedback-v0 and Retry-v0 (``ENV_IDS``), and ``rg/<task>-v0`` for every reasoning-gym task
(``RG_ENV_IDS``; reasoning-gym itself is imported only when one is built). ``python -m
llm_envs.list`` lists them all; ``python -m llm_envs.check ENV`` steps one with scripted turns.

An environment's author needs only the names below (``__all__``): ``TaskEnv`` or ``MultiTurnEnv``,
``Example``, ``Score`` or ``Reply``, ``chat``, ``register``, ``require``, and for tools ``tool`` and
``tool_prompt`` (a tool's ``state`` and ``example`` parameters are its episode's).
"""

from llm_envs.core import AnyText, TaskEnv, chat, render_prompt, with_opening
from llm_envs.multiturn import MultiTurnEnv, Reply
from llm_envs.tools import Tool, tool, tool_prompt
from llm_envs.data import DataError, FieldError, load_rows, require
from llm_envs.registry import ENV_IDS, UnknownEnvError, make, register
from llm_envs.scoring import BatchScorer
from llm_envs.types import Example, Score

# Each module registers its environment at import.
from llm_envs.envs import arc_agi, conciseness, countdown, math_reasoning, rg, sudoku  # noqa: E402,F401
from llm_envs.envs import countdown_calc, guess_number, retry, sudoku_feedback  # noqa: E402,F401  (multi-turn)
from llm_envs.envs.rg import RG_ENV_IDS  # noqa: E402

__all__ = [
    "AnyText", "BatchScorer", "DataError", "ENV_IDS", "Example", "FieldError", "MultiTurnEnv", "RG_ENV_IDS", "Reply",
    "Score", "TaskEnv", "Tool", "UnknownEnvError", "chat", "load_rows", "make", "register", "render_prompt", "require",
    "tool", "tool_prompt", "with_opening",
]
