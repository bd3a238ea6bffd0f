"""``--engine auto``: the one rule that decides which engine generates when the user did not say.

Every command that generates resolves ``auto`` through ``trainers.common.runtime.resolve``, which
applies this rule to the model's config (ES, GRPO, Dr.GRPO, PPO, ``python -m eval``, the study;
``make_engine`` applies it to a loaded model for a caller that passes ``auto`` on), so they all pick
the same engine for the same model on the same device. The rule and the measurements behind it (``docs/engines.md``,
``docs/benchmarks.md``):

- **CPU, a model native runs** (Llama family, Qwen2): **native**. Measured faster for every
  workload (default model, side by side in one run): plain generation 1.13-1.28x HF at 48 tokens,
  5.1x at up to 256 (HF keeps finished rows and grows its cache by concatenation); low-rank ES
  1.16-3.95x; full-rank ES 1.31x in fp32, 1.09x in bf16. An RL step's sampling is the same plain
  sampled generation (``benchmarks.speed.rl``: ours on native 13-25 s against TRL's HF
  ``generate`` 37-49 s on the same batch; our hf engine was not in that run).
- **CUDA, a model native runs: native.** On an H200 (``benchmarks.gpu.check``): generation 5128
  against 2400 tokens/s, a low-rank ES iteration 2.8 against 3.1 s.
- **A model native does not run** (another architecture, sliding-window attention): **hf**.
- **Any other device** (MPS, ...): **hf**; native has not been run there.

vLLM is never picked: it needs an extra, takes seconds to start for every run and evaluation, and
holds its own copy of the weights (~6x them at start on the default model); ask for it by name.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import torch

from trainers.engines.native.model import unsupported

#: Devices the native engine has been measured faster than HF on.
NATIVE_DEVICES = ("cpu", "cuda")


class EngineChoice(NamedTuple):
    """The engine that generates, and why (what a run records next to it)."""

    engine: str
    why: str


def choose_engine(model_or_config, device: torch.device | str) -> EngineChoice:
    """The engine ``--engine auto`` means for a model (or its ``transformers`` config) on
    ``device``: native where it runs the model on CPU or CUDA, hf otherwise (table above)."""
    device = torch.device(device)
    config = getattr(model_or_config, "config", model_or_config)
    cannot = unsupported(SimpleNamespace(config=config))
    if cannot is not None:
        return EngineChoice("hf", f"auto: {cannot}")
    if device.type not in NATIVE_DEVICES:
        return EngineChoice("hf", f"auto: the native engine has not been run on {device.type}")
    return EngineChoice("native", f"auto: native runs {config.model_type} models and was measured faster than hf "
                                  f"on {device.type} (docs/engines.md)")
