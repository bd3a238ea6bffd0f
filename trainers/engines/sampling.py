"""Sampled decoding with one random stream per row: a row's sample depends on its seed and the
model alone, never on the rows beside it, how a call is split into batches or waves, the batch
size, or which process drew it.

A call's rows get their seeds from ``row_seeds``: one per row given by the caller (a trainer
derives them from (run seed, step, prompt, sample)), or derived from (call seed, row index). Row
k's stream is a fixed sequence of uniform numbers, one per generated token (``row_uniforms``); the
token at step t is the inverse CDF of the warped distribution at row k's t-th number. The hf and
native engines both sample here (``Sampler``), so on the same logits they draw the same tokens;
vLLM draws from each request's own seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

Seeds = int | Sequence[int] | None


def row_seeds(seed: Seeds, rows: int) -> list[int] | None:
    """One 63-bit sampling seed per row: ``seed`` itself when it is a sequence (one per row), else
    derived from (``seed``, row index) alone, so row k's seed does not depend on how many rows the
    call has; None for an unseeded call."""
    if seed is None:
        return None
    if not isinstance(seed, (int, np.integer)):
        seeds = [int(s) for s in seed]
        if len(seeds) != rows:
            raise ValueError(f"{len(seeds)} sampling seeds for {rows} rows: give one per row (prompt x sample)")
        return seeds
    base = int(seed) % (1 << 64)
    return [int(np.random.SeedSequence([base, k]).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)
            for k in range(rows)]


def row_uniforms(seeds: list[int] | None, steps: int, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(rows, steps)`` uniform numbers in [0, 1): row k's from a generator seeded with
    ``seeds[k]`` (from torch's global generator when ``seeds`` is None)."""
    if seeds is None:
        return torch.rand(rows, steps, dtype=torch.float64).to(device)
    out = torch.empty(rows, steps, dtype=torch.float64)
    gen = torch.Generator()
    for k, s in enumerate(seeds):
        out[k] = torch.rand(steps, generator=gen.manual_seed(s), dtype=torch.float64)
    return out.to(device)


@dataclass
class Sampler:
    """The next token of every row: greedy, or sampled with temperature, top-k and top-p applied as
    Hugging Face's logits warpers apply them (temperature, then top-k, then top-p)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __call__(self, logits: torch.Tensor, uniforms: torch.Tensor | None = None,
                 suppress: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids ``(rows,)`` from ``logits (rows, vocab)``; ``uniforms (rows,)``: each row's
        number for this step (sampling only); ``suppress``: ids that may not be chosen yet (the
        stop tokens before ``min_new_tokens``)."""
        logits = logits.float()
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
        # Inverse CDF in float64: the first token whose cumulative probability exceeds u * total
        # (tokens of probability 0 are never chosen: their CDF step is flat).
        cdf = torch.softmax(logits, dim=-1).double().cumsum(dim=-1)
        if uniforms is None:
            uniforms = torch.rand(logits.shape[0], dtype=torch.float64, device=logits.device)
        u = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
