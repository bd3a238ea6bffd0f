"""ES's fp32 master weights on disk and across processes: a bf16 model's weights alone would lose
the sub-step part of every update on resume, so a checkpoint saves the masters beside them
(``tensors.safetensors``), and processes compare them with the weights (``weights_of_record``).
Which tensors get a master is ``precision.needs_masters``; ``trainers/es/noise/fullrank.py`` keeps them."""

from __future__ import annotations

from pathlib import Path

import torch

from trainers.common.config import ConfigError
from trainers.common.run_dir import TENSORS_FILE
from trainers.es.noise import fullrank


def masters_of(params: fullrank.Params) -> dict[str, torch.Tensor]:
    """The fp32 master weights to checkpoint (none for fp32 models)."""
    return {name: m for name, m in zip(params.names, params.masters) if m is not None}


def load_masters(params: fullrank.Params, checkpoint: Path) -> None:
    """Restore the fp32 masters saved with a checkpoint (and the model's weights from them)."""
    if not any(m is not None for m in params.masters):
        return
    path = checkpoint / TENSORS_FILE
    if not path.is_file():
        raise ConfigError(f"checkpoint {checkpoint} has no fp32 master weights ({TENSORS_FILE}); it cannot be resumed "
                          f"exactly with --fp32-master")
    from safetensors.torch import load_file

    saved = load_file(str(path))
    for i, (name, master) in enumerate(zip(params.names, params.masters)):
        if master is not None:
            master.copy_(saved[name])
            params.tensors[i].data.copy_(master)


def weights_of_record(model, params: fullrank.Params) -> list[torch.Tensor]:
    """What every process must hold identically: the model's parameters (tied ones once) and the
    fp32 masters, if any."""
    return [p for _, p in model.named_parameters()] + [m for m in params.masters if m is not None]
