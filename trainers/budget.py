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

    def add(self, responses: int, tokens: int) -> None:
        self.samples += int(responses)
        self.tokens += int(tokens)
