"""What one engine call can evaluate for ES: a member of the paper's loop, or a low-rank population.

- ``FullRankMember``: every row of the call sees the weights master + sign * sigma * eps(seed)
  (``fullrank.py``), and the engine's weights are the master again, bit for bit, when the call
  returns.
- ``LowRankMembers``: a whole low-rank population (``lowrank.py``) in one call. Rows are
  member-major (member k owns rows ``k * P .. k * P + P - 1``) and member k's rows see
  W + sign_k * sigma * E_k on every perturbed layer.
- ``AdapterMembers``: a whole population of LoRA adapters (``adapters.py``) in one call, rows
  member-major as above: member k's rows see the adapter factors + sign_k * sigma * eps(seed_k).

The noise is defined by the model's own parameters (names, order, device, seeds), never by the
engine: a run resumes or replays on another engine with the same weights. These types live below
the engines (``trainers/engines/``), which evaluate them, and below ES (``trainers/es/train.py``), which
builds them: the arrow runs es -> engines -> noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainers.es.noise.adapters import AdapterLayer
from trainers.es.noise.fullrank import Params
from trainers.es.noise.lowrank import Layer


@dataclass(frozen=True)
class FullRankMember:
    """Member ``seed`` of the paper's loop: theta + sign * sigma * eps(seed) on ``params``."""

    params: Params
    seed: int
    sigma: float
    sign: float = 1.0
    shared: bool = False  # the paper's code's noise: one seed for every tensor


@dataclass(frozen=True)
class LowRankMembers:
    """Members ``seeds[k]`` (sign ``signs[k]``) of a low-rank population; rows member-major."""

    layers: Sequence[Layer]
    seeds: Sequence[int]
    signs: Sequence[float]
    sigma: float
    rank: int

    def rows_per_member(self, rows: int) -> int:
        if rows % len(self.seeds):
            raise ValueError(f"low-rank members: {rows} rows do not split into {len(self.seeds)} members equally")
        return rows // len(self.seeds)

    def subset(self, members: Sequence[int]) -> LowRankMembers:
        """The population of ``members`` alone (their indices here), in that order."""
        return LowRankMembers(self.layers, [self.seeds[m] for m in members], [self.signs[m] for m in members],
                              self.sigma, self.rank)


@dataclass(frozen=True)
class AdapterMembers:
    """Members ``seeds[k]`` (sign ``signs[k]``) of an ES population on LoRA adapters; rows member-major."""

    params: Params  # the adapter factors, A then B per layer (``adapters.params_of``)
    layers: Sequence[AdapterLayer]
    seeds: Sequence[int]
    signs: Sequence[float]
    sigma: float

    rows_per_member = LowRankMembers.rows_per_member

    def subset(self, members: Sequence[int]) -> AdapterMembers:
        """The population of ``members`` alone (their indices here), in that order."""
        return AdapterMembers(self.params, self.layers, [self.seeds[m] for m in members],
                              [self.signs[m] for m in members], self.sigma)


#: The perturbations whose members each own a block of a call's rows (one batched generation).
BATCHED = (LowRankMembers, AdapterMembers)

Perturbation = FullRankMember | LowRankMembers | AdapterMembers
