"""The sample budget: cumulative generated responses (the paper's sample evaluations) and tokens,
so ES and RL runs compare at equal budgets, and the optional cap ``--max-samples``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    """Cumulative generated responses (``samples``) and tokens, and the optional cap
    ``max_samples`` that a run never exceeds."""

    max_samples: int | None = None
    samples: int = 0
    tokens: int = 0

    def allows(self, responses: int) -> bool:
        return self.max_samples is None or self.samples + responses <= self.max_samples

    def steps_left(self, wanted: int, per_step: int) -> int:
        """How many of ``wanted`` more steps of ``per_step`` responses each fit within the cap."""
        return wanted if self.max_samples is None else min(wanted, (self.max_samples - self.samples) // per_step)

    def add(self, responses: int, tokens: int) -> None:
        self.samples += int(responses)
        self.tokens += int(tokens)
