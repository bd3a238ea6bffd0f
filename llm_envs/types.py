"""The data every layer passes around: a problem (``Example``) and the verdict on a completion
(``Score``). A leaf module: it imports nothing from the project."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class Example:
    """One problem: a chat prompt and what the scorer needs to check an answer.

    A prompt may end with an assistant message: the opening of the assistant's turn, which
    generation continues and the scorer sees in front of the completion (``opening``).
    """

    id: str
    prompt: list[Message]
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def opening(self) -> str:
        """How the assistant's turn begins: the content of a final assistant message, else ``""``."""
        last = self.prompt[-1] if self.prompt else None
        if isinstance(last, dict) and last.get("role") == "assistant":
            return last.get("content") or ""
        return ""


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
