"""The generation-engine interface every trainer, the eval harness and the benchmarks hold.

An engine completes a list of rows (a prompt each, one set of decoding settings, a seed) and
returns a ``GenerationResult``; it may evaluate an ES perturbation while it does
(``trainers/es/noise/members.py``: one full-rank member, or a whole low-rank population).

``sync_weights`` tells the engine that the model's weights changed (an ES update, an optimizer
step); engines that generate with the model itself (``hf``) have nothing to do.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

import torch

from trainers.engines.generation import GenerationResult, Prompt
from trainers.engines.sampling import Seeds
from trainers.es.noise import fullrank
from trainers.es.noise.members import FullRankMember, Perturbation


class Engine(ABC):
    """Generates completions for ``model`` (a Hugging Face causal LM: the weights of record).

    ``schedules_rows``: the engine batches a call's rows itself within its own memory (vLLM);
    otherwise callers size calls to memory (``trainers.engines.generation.rows_that_fit``).
    ``finished_rows_only``: its progress counts a row only when the row finishes (vLLM), not at
    every decode step, so the pace of a call is known only once the call ends.
    ``shares_prompts``: a call's rows with the same prompt (a group's responses) have that prompt
    computed once (native), so a call's prompt pass costs its distinct prompts, not its rows."""

    name: ClassVar[str]
    schedules_rows: ClassVar[bool] = False
    finished_rows_only: ClassVar[bool] = False
    shares_prompts: ClassVar[bool] = False

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @abstractmethod
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 256, batch_size: int = 32,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: Seeds = None,
                 num_return_sequences: int = 1, progress: bool | str = False, sort: bool = True,
                 min_new_tokens: int = 0, on_progress: Callable[[float, int, float], None] | None = None,
                 perturbation: Perturbation | None = None, stop_strings: Sequence[str] = ()) -> GenerationResult:
        """Complete each prompt (greedy when ``temperature == 0``), as ``trainers.engines.generation.generate``
        does, optionally under ``perturbation``; a completion ends at its first stop token or of
        ``stop_strings``, and is cut by ``result_of``'s one rule (the text up to and including the string). Sampling: ``seed`` is one seed per row (prompt-major)
        or one per call (``sampling.row_seeds``); every engine draws row k from its own seed only. ``batch_size`` and ``sort`` shape the batches of
        engines that do not schedule rows themselves. ``progress`` (a bar, named when a string) and
        ``on_progress(done, total, seconds)`` report the rows done."""

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """The model's weights changed: make the engine generate with the new ones. ``weights``:
        (name, full tensor) pairs to take instead of reading the model, one at a time (a sharded
        policy gathers each parameter as the engine asks for it, so the peak extra memory is one
        full parameter); names are the model's ``named_parameters`` names."""

    def close(self) -> None:
        """Free what the engine holds beyond the model."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ModelWeightsEngine(Engine):
    """An engine that generates with the model's own weight tensors (``hf``, ``native``): nothing to
    sync, a full-rank member is written into them for the call (``written_into_weights``), and a
    ``compute_dtype`` other than the weights' dtype generates under autocast (the RL policy: fp32
    weights, bf16 compute, on CUDA and on a CPU with bf16 units; autocast caches each weight's bf16
    copy for the whole call)."""

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Nothing to do for the model's own weights; given ``weights``, copy each into the model
        (the engine then generates with a plain copy of a model sharded elsewhere)."""
        if weights is None:
            return
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                own[name].copy_(tensor)

    def __init__(self, model, tokenizer, compute_dtype: torch.dtype | None = None):
        super().__init__(model, tokenizer)
        weights = next(model.parameters()).dtype
        self.autocast = compute_dtype is not None and compute_dtype != weights
        self.compute_dtype = compute_dtype if self.autocast else weights

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.compute_dtype) if self.autocast \
            else contextlib.nullcontext()

    @staticmethod
    @contextlib.contextmanager
    def written_into_weights(member: FullRankMember):
        """Within the block the model's own weights are the member's; afterwards the master again,
        exactly (``fullrank.perturb`` / ``fullrank.restore``)."""
        patches = fullrank.perturb(member.params, member.seed, member.sigma, member.sign, member.shared)
        try:
            yield
        finally:
            fullrank.restore(member.params, member.seed, member.sigma, patches, member.sign, member.shared)
