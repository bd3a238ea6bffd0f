"""The Hugging Face engine (``--engine hf``): ``generate`` of the model itself. ``--engine auto`` picks it
for models and devices the native engine does not run (``choice.py``).

Perturbations act on the model: a full-rank member is written into its weights in place and
restored exactly afterwards (``noise.perturb`` / ``noise.restore``); low-rank members are forward
hooks that add each member's ``x E_k^T`` to its own rows (``lowrank.Population``), and a population
of LoRA adapters hooks that add each member's adapter to its own rows, the model's own adapter off
(``adapters.AdapterPopulation``). A PEFT model otherwise generates as PEFT runs it. Without a
population, rows with the same prompt (an RL group) have it computed once (``prompt_cache``).
"""

from __future__ import annotations

import contextlib

from trainers.engines.base import ModelWeightsEngine
from trainers.engines.generation import GenerationResult, generate
from trainers.engines.prompt_cache import can_share_prompts
from trainers.es.noise import lowrank
from trainers.es.noise.adapters import AdapterPopulation
from trainers.es.noise.members import BATCHED, AdapterMembers, FullRankMember, LowRankMembers, Perturbation


class HFEngine(ModelWeightsEngine):
    """``transformers`` generation on the model's own weights."""

    name = "hf"

    def generate(self, prompts, max_new_tokens=256, batch_size=32, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                 num_return_sequences=1, progress=False, sort=True, min_new_tokens=0, on_progress=None,
                 perturbation: Perturbation | None = None, stop_strings=()) -> GenerationResult:
        rows = len(prompts) * num_return_sequences
        batched = isinstance(perturbation, BATCHED)
        if batched:  # the hooks need the member-major rows in one batch
            batch_size, sort = max(1, rows), False
        with self._perturbed(perturbation, rows), self._autocast():
            return generate(self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                            temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            num_return_sequences=num_return_sequences, progress=progress, sort=sort,
                            min_new_tokens=min_new_tokens, on_progress=on_progress, stop_strings=stop_strings,
                            share_prompts=not batched)  # a population's rows differ under equal prompts

    @property
    def shares_prompts(self) -> bool:
        """A group's prompt is computed once where the model allows it (``prompt_cache``)."""
        return can_share_prompts(self.model)

    @contextlib.contextmanager
    def _perturbed(self, p: Perturbation | None, rows: int):
        if p is None:
            yield
        elif isinstance(p, FullRankMember):
            with self.written_into_weights(p):
                yield
        elif isinstance(p, LowRankMembers):
            p.rows_per_member(rows)  # rows must be member-major, equally many per member
            with lowrank.Population(p.layers, p.seeds, p.signs, p.sigma, p.rank).applied():
                yield
        elif isinstance(p, AdapterMembers):
            p.rows_per_member(rows)
            with AdapterPopulation.of_members(p.params, p.layers, p.seeds, p.signs, p.sigma).applied():
                yield
        else:
            raise TypeError(f"unknown perturbation {type(p).__name__}")
