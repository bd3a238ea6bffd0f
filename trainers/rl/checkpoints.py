"""RL checkpoints: the weights (Hugging Face format, through the run directory) plus what resuming
an optimizer-based run needs besides them: the optimizer, the RNG states and extra modules such
as a critic, in ``trainer.pt``, and with ``--epochs`` > 1 the sampled batch the next optimizer
steps still use, in ``batch.pt``. (ES needs only the weights: its updates are in updates.jsonl.)"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from trainers.common.run_dir import RunDir

TRAINER_FILE = "trainer.pt"  # optimizer, RNG and extra module states, next to the HF weights
BATCH_FILE = "batch.pt"  # a sampled batch still in use (epochs > 1), written before TRAINER_FILE


def save_checkpoint(run: RunDir, model, tokenizer, step: int, state: dict[str, Any], optimizer,
                    modules: dict[str, torch.nn.Module] | None = None, keep: int = 2, batch: Any = None) -> None:
    """Weights (Hugging Face format) + JSON ``state`` through the run directory, then ``batch``
    (any picklable object: a sampled batch that later steps still use) in ``batch.pt``, then the
    optimizer, RNG and ``modules`` (e.g. a critic) in ``trainer.pt``. A checkpoint without
    ``trainer.pt`` (killed in between) is skipped on resume, and ``keep >= 2`` leaves the previous one."""
    if not run.is_main:
        return
    run.save_checkpoint(model, tokenizer, step, state, keep=max(2, keep))
    if batch is not None:
        path = run.checkpoint_dir(step) / BATCH_FILE
        torch.save(batch, path.with_name(BATCH_FILE + ".tmp"))
        os.replace(path.with_name(BATCH_FILE + ".tmp"), path)
    blob = {"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "modules": {k: m.state_dict() for k, m in (modules or {}).items()}}
    path = run.checkpoint_dir(step) / TRAINER_FILE
    torch.save(blob, path.with_name(TRAINER_FILE + ".tmp"))
    os.replace(path.with_name(TRAINER_FILE + ".tmp"), path)


def latest_checkpoint(run: RunDir) -> tuple[int, dict[str, Any]] | None:
    """(step, JSON state) of the newest complete RL checkpoint, or ``None``."""
    for step in reversed(run.checkpoints()):
        d = run.checkpoint_dir(step)
        if (d / TRAINER_FILE).is_file():
            return step, json.loads((d / "trainer_state.json").read_text())
    return None


def load_batch(run: RunDir, step: int, device: torch.device | str) -> Any:
    """The batch saved with checkpoint ``step`` (its tensors on ``device``), or ``None``."""
    path = run.checkpoint_dir(step) / BATCH_FILE
    return torch.load(path, map_location=device, weights_only=False) if path.is_file() else None


def restore_trainer(run: RunDir, step: int, optimizer, modules: dict[str, torch.nn.Module] | None = None) -> None:
    """Load the optimizer, RNG and module states saved with checkpoint ``step``."""
    blob = torch.load(run.checkpoint_dir(step) / TRAINER_FILE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    for k, m in (modules or {}).items():
        m.load_state_dict(blob["modules"][k])
    torch.set_rng_state(blob["torch_rng"])
    if blob["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])
