"""The runtime of a run, resolved once: which model (its config and layer shapes), which compute
dtype and which generation engine, each with its reason.

Every command that generates asks here and nowhere else: ES, GRPO, Dr.GRPO, PPO, ``python -m
eval``, the study and the benchmarks' headers. ``resolve`` does one model lookup (``model_config``:
the default model's converted copy, a local directory or ``.gguf`` file, the Hugging Face cache,
then the hub for the config alone) and from that config decides

- the compute dtype (``precision.settle``: an explicit ``--dtype``, a resumed run's own, or for
  ``auto`` bf16 on CUDA and on CPU the probe of *this model's* layer shapes), and
- the engine (``engines.choice.choose_engine``: an explicit ``--engine``, a resumed run's own, or for
  ``auto`` native where it runs the model on CPU or CUDA, hf otherwise).

On several processes rank 0 alone resolves (the probe times the CPU: ranks probing at once on
shared cores would measure each other) and ``broadcast`` hands every rank rank 0's answer. A run
records it in runtime.jsonl (``Runtime.record``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainers.common import precision
from trainers.common.models import model_config
from trainers.common.precision import Decision
from trainers.engines.choice import choose_engine
from trainers.engines.options import AUTO


@dataclass
class Runtime:
    """What a run computes with, and why (``resolve``)."""

    device: str  # "cpu", "cuda", ...
    precision: Decision
    engine: str
    engine_why: str
    model_type: str | None = None
    shape: dict[str, int] = field(default_factory=dict)

    @property
    def dtype(self) -> str:
        """``fp32`` or ``bf16``: what ``--dtype`` and config.yaml hold."""
        return self.precision.dtype

    def record(self) -> dict[str, Any]:
        """What runtime.jsonl holds of it."""
        return {"device": self.device, "precision": self.precision.record(), "engine": self.engine,
                "engine_why": self.engine_why, "model_type": self.model_type, "shape": self.shape}

    def engine_options(self, options):
        """``options`` (a config's ``EngineOptions``, its vLLM settings kept) with the engine resolved."""
        resolved = options.engine_options()
        resolved.engine = self.engine
        return resolved

    def line(self) -> str:
        """One line for logs and benchmark headers."""
        return f"{self.device}, dtype {self.precision.line()}, engine {self.engine} ({self.engine_why})"


def resolve(model: Any, device: torch.device | str, dtype: str | None = "auto", engine: str = AUTO,
            recorded: dict[str, Any] | None = None, resume: str | None = None,
            broadcast: Callable[[Any], Any] | None = None, is_main: bool = True) -> Runtime:
    """The runtime of ``model`` on ``device`` for ``--dtype dtype`` and ``--engine engine``.

    ``recorded``: what a resumed run recorded at its first start (``{"dtype": ..., "engine": ...}``):
    its dtype stands (another explicit one is a ``ValueError`` naming both, ``precision.settle``) and
    ``auto`` keeps its engine. On several processes pass ``broadcast`` (rank 0's object to every
    rank) and ``is_main``: only rank 0 looks up and decides."""
    runtime = None
    if is_main:
        device = torch.device(device)
        config = model_config(model)
        shape = precision.model_shape(config)
        recorded = recorded or {}
        decision = precision.settle(dtype, device, config, recorded.get("dtype"), resume)
        if engine != AUTO:
            chosen, why = engine, f"asked for (--engine {engine})"
        elif recorded.get("engine"):
            chosen, why = recorded["engine"], "resumed: the engine the run started with"
        else:
            chosen, why = choose_engine(config, device)
        runtime = Runtime(device.type, decision, chosen, why, getattr(config, "model_type", None), shape)
    if broadcast is not None:
        runtime = broadcast(runtime)
    return runtime
