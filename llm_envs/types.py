"""The data every layer passes around: a problem (``Example``) and the verdict on a completion
(``Score``). A leaf module: it imports nothing from the project."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class Example:
    """One problem: a chat prompt and what the scorer needs to check an answer."""

    id: str
    prompt: list[Message]
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Score:
    """The verdict on one completion.

    ``reward`` is the shaped training reward, ``correct`` the pass/fail used for pass@k,
    ``parts`` the reward's components and ``error`` why scoring failed (``None`` when it did not).
    """

    reward: float
    correct: bool
    parts: dict[str, float] = field(default_factory=dict)
    error: str | None = None
