"""The next token of every live row: greedy, or sampled with temperature, top-k and top-p applied
as Hugging Face's logits warpers apply them (temperature, then top-k, then top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampler:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    generator: torch.Generator | None = None  # seeded per call: the same seed gives the same samples

    def __call__(self, logits: torch.Tensor, suppress: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids ``(rows,)`` from fp32 ``logits (rows, vocab)``; ``suppress``: ids that may not
        be chosen yet (the stop tokens before ``min_new_tokens``)."""
        if suppress is not None:
            logits = logits.index_fill(1, suppress, float("-inf"))
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, index = torch.sort(logits, dim=-1)  # ascending, as HF's TopPLogitsWarper
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - self.top_p
            drop[:, -1] = False  # always keep the most likely token
            logits = logits.masked_fill(drop.scatter(1, index, drop), float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
