"""LoRA adapters in the vLLM engine as ``LoRARequest``s: an ES population on adapters
(``--lora-rank R --engine vllm``) in one batched generation, each member's rows under its own adapter
(vLLM's multi-LoRA kernels).

In this mode (``VLLMEngine(..., lora_members=N)``) the engine keeps the base weights unmerged and
never reloads them: what changes between calls is only the adapters, written as PEFT adapters.

- **Member k** of ``AdapterMembers``: its factors are ``adapters.member_factors`` (the masters plus
  ``sign_k * sigma * eps(seed_k)``, the very factors the hf and native engines apply), the scale
  ``alpha / R`` folded into B (the file says ``lora_alpha = r``).
- **A plain generation** (held-out evaluation, the unperturbed adapter) serves the adapter itself
  the same way; it is rewritten after each ``sync_weights`` (an ES update).
- **Fresh ids.** vLLM caches an adapter by its integer id, so every written adapter gets a new one
  (a reused id would serve the last call's values), and a call's adapters are removed from the
  engine and from disk (``/dev/shm`` where it exists) when the call ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from trainers.es.noise.adapters import adapter_layers, member_factors
from trainers.es.noise.members import AdapterMembers

#: The adapter ranks vLLM's multi-LoRA accepts (``max_lora_rank``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_rank(rank: int) -> int:
    """The smallest rank slot vLLM accepts that holds adapters of ``rank``."""
    fitting = [r for r in VLLM_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"--lora-rank {rank}: vLLM's multi-LoRA holds ranks up to {VLLM_RANKS[-1]}")
    return fitting[0]


def adapter_rank(model) -> int:
    """The rank of ``model``'s active adapter (one rank for every layer)."""
    ranks = {layer.A.shape[0] for layer in adapter_layers(model, model.active_adapter)}
    if len(ranks) != 1:
        raise ValueError(f"--engine vllm serves adapters of one rank; this model's adapters have ranks {sorted(ranks)}")
    return ranks.pop()


def write_lora_adapter(path: Path, factors: dict[str, tuple[torch.Tensor, torch.Tensor]], rank: int) -> None:
    """A PEFT LoRA adapter at ``path`` (created) that adds ``B A x`` to each module: ``factors`` maps
    the module's PEFT name (``base_model.model.<module>``) to ``(A (R, d_in), B (d_out, R))``, any
    scale already in B (``lora_alpha = r``: scale 1)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, (a, b) in factors.items():
        tensors[f"{name}.lora_A.weight"] = a.detach().float().contiguous()
        tensors[f"{name}.lora_B.weight"] = b.detach().float().contiguous()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "bias": "none",
        "target_modules": sorted({name.rsplit(".", 1)[1] for name in factors}), "base_model_name_or_path": "base"}))


class AdapterRequests:
    """Writes adapters for one engine and hands out their ``LoRARequest``s."""

    def __init__(self, engine, model):
        from vllm.lora.request import LoRARequest

        self._request = LoRARequest
        self.engine = engine
        self.layers = adapter_layers(model, model.active_adapter)
        self.rank = adapter_rank(model)
        shm = Path("/dev/shm")
        self._root = tempfile.TemporaryDirectory(prefix="llm_envs_lora_", dir=shm if shm.is_dir() else None)
        self._ids = itertools.count(1)
        self._own = None  # the adapter itself, until the next sync_weights

    def _write(self, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]):
        """A PEFT adapter of per-layer factors ``A[i] (R, d_in)``, ``B[i] (d_out, R)``, under a fresh id."""
        lora_id = next(self._ids)
        path = Path(self._root.name) / str(lora_id)
        write_lora_adapter(path, {layer.name: (a, layer.scale * b.detach().float())
                                  for layer, a, b in zip(self.layers, A, B)}, self.rank)
        return self._request(f"llm_envs_{lora_id}", lora_id, str(path))

    def _drop(self, request) -> None:
        self.engine.llm.llm_engine.remove_lora(request.lora_int_id)
        shutil.rmtree(request.lora_path, ignore_errors=True)

    def own(self):
        """The request of the adapter as it is now."""
        if self._own is None:
            self._own = self._write([layer.A for layer in self.layers], [layer.B for layer in self.layers])
        return self._own

    def changed(self) -> None:
        """The adapter's values changed (an update): its next request is written anew."""
        if self._own is not None:
            self._drop(self._own)
            self._own = None

    @contextlib.contextmanager
    def members(self, p: AdapterMembers, rows: int) -> Iterator[list]:
        """Each of ``rows`` rows' request (rows member-major), for one call; removed afterwards."""
        per_member = p.rows_per_member(rows)
        A, B = member_factors(p.params, p.layers, p.seeds, p.signs, p.sigma)
        requests = [self._write([a[k] for a in A], [b[k] for b in B]) for k in range(len(p.seeds))]
        try:
            yield [requests[k // per_member] for k in range(rows)]
        finally:
            for request in requests:
                self._drop(request)

    def close(self) -> None:
        self._root.cleanup()
