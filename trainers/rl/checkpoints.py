"""RL checkpoints: the weights (Hugging Face format, through the run directory) plus what resuming
an optimizer-based run needs besides them: the optimizer, the RNG states and extra modules such
as a critic, in ``trainer.pt``, and with ``--epochs`` > 1 the sampled batch the next optimizer
steps still use, in ``batch.pt``. (ES needs only the weights: its updates are in updates.jsonl.)

A run on several processes (FSDP, ``trainers.rl.sharding``) writes the same Hugging Face weights,
gathered one parameter at a time to rank 0, but the optimizer and the critic as shards: each rank
writes its own into ``shards/`` (``torch.distributed.checkpoint``), and its own sampled batch into
``batch.rank<R>.pt``; ``trainer.pt`` then holds the world size and every rank's RNG state. All of
it is written into the checkpoint's temporary directory, which rank 0 renames once every rank is
done (``files.atomic_directory``). Such a checkpoint resumes on the same number of processes."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from trainers.common.config import ConfigError
from trainers.common.files import atomic_directory, atomic_write
from trainers.common.models import save_model
from trainers.common.run_dir import RunDir
from trainers.rl.sharding import Ranks, full_state_dict, load_shards, save_shards

TRAINER_FILE = "trainer.pt"  # optimizer, RNG and extra module states, next to the HF weights
BATCH_FILE = "batch.pt"  # a sampled batch still in use (epochs > 1), written before TRAINER_FILE
SHARDS_DIR = "shards"  # several processes: the optimizer and critic shards (torch.distributed.checkpoint)


def save_checkpoint(run: RunDir, model, tokenizer, step: int, state: dict[str, Any], optimizer,
                    modules: dict[str, torch.nn.Module] | None = None, keep: int = 2, batch: Any = None,
                    ranks: Ranks | None = None) -> None:
    """Weights (Hugging Face format) + JSON ``state`` through the run directory, then ``batch``
    (any picklable object: a sampled batch that later steps still use) in ``batch.pt``, then the
    optimizer, RNG and ``modules`` (e.g. a critic) in ``trainer.pt``. A checkpoint without
    ``trainer.pt`` (killed in between) is skipped on resume, and ``keep >= 2`` leaves the previous one.
    Sharded ``ranks``: every rank calls it (``save_sharded``)."""
    if ranks is not None and ranks.sharded:
        save_sharded(run, ranks, model, tokenizer, step, state, optimizer, modules or {}, keep, batch)
        return
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


def batch_file(ranks: Ranks | None = None) -> str:
    """The name of the sampled batch's file: one per rank on several processes."""
    return f"batch.rank{ranks.rank}.pt" if ranks is not None and ranks.sharded else BATCH_FILE


def load_batch(run: RunDir, step: int, device: torch.device | str, ranks: Ranks | None = None) -> Any:
    """The batch (this rank's) saved with checkpoint ``step`` (its tensors on ``device``), or ``None``."""
    path = run.checkpoint_dir(step) / batch_file(ranks)
    return torch.load(path, map_location=device, weights_only=False) if path.is_file() else None


def check_processes(run: RunDir, step: int, state: dict[str, Any], world: int) -> None:
    """A checkpoint resumes on as many processes as wrote it (its JSON ``state`` says how many)."""
    saved = state.get("processes", 1)
    if saved != world:
        how = f"torchrun --nproc-per-node {saved}" if saved > 1 else "one process (no torchrun/accelerate)"
        raise ConfigError(f"--resume {run.path}: checkpoint {step} was written by {saved} process(es) and resumes "
                          f"on as many, this launch has {world}: launch it with {how}")


def restore_trainer(run: RunDir, step: int, optimizer, modules: dict[str, torch.nn.Module] | None = None) -> None:
    """Load the optimizer, RNG and module states saved with checkpoint ``step``."""
    blob = torch.load(run.checkpoint_dir(step) / TRAINER_FILE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    for k, m in (modules or {}).items():
        m.load_state_dict(blob["modules"][k])
    torch.set_rng_state(blob["torch_rng"])
    if blob["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])


# ----- several processes (FSDP) --------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def save_sharded(run: RunDir, ranks: Ranks, model, tokenizer, step: int, state: dict[str, Any], optimizer,
                 modules: dict[str, torch.nn.Module], keep: int = 2, batch: Any = None) -> None:
    """Every rank: the checkpoint of a sharded run, whole or not at all. Rank 0 opens the
    temporary directory; each rank writes its optimizer and critic shards and its batch into it;
    then, while the others wait (the long barrier), rank 0 writes the gathered Hugging Face weights,
    ``trainer.pt`` and the JSON state, and renames the directory."""
    weights = full_state_dict(model, keep=ranks.is_main)  # one parameter at a time, to rank 0
    rngs = ranks.gather([rng_state()])
    with (atomic_directory(run.checkpoint_dir(step)) if ranks.is_main else contextlib.nullcontext()) as tmp:
        tmp = Path(ranks.broadcast(str(tmp) if ranks.is_main else None))
        if batch is not None:
            torch.save(batch, tmp / batch_file(ranks))
        save_shards(tmp / SHARDS_DIR, model, modules, optimizer)  # each rank its own shard
        ranks.wait_for_main()  # every rank's files are in: rank 0 may finish and rename
        if ranks.is_main:
            model.save_pretrained(tmp, state_dict=weights)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            torch.save({"world": ranks.world, "shards": SHARDS_DIR, "rng": rngs,
                        "modules": sorted(modules)}, tmp / TRAINER_FILE)
            atomic_write(tmp / "trainer_state.json", json.dumps({**state, "processes": ranks.world}))
    if ranks.is_main:
        run.prune_checkpoints(max(2, keep))
    ranks.wait_for_main()  # the others wait here while rank 0 writes the weights


def restore_sharded(run: RunDir, ranks: Ranks, step: int, model, optimizer,
                    modules: dict[str, torch.nn.Module] | None = None) -> None:
    """Every rank: load its optimizer and critic shards and its RNG state from checkpoint ``step``
    (written by as many processes; the weights come from the checkpoint's Hugging Face files)."""
    d = run.checkpoint_dir(step)
    blob = torch.load(d / TRAINER_FILE, map_location="cpu", weights_only=False)
    assert blob["world"] == ranks.world, "checked by check_processes before anything was loaded"
    load_shards(d / blob["shards"], model, modules or {}, optimizer)
    rng = blob["rng"][ranks.rank]
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def save_final(ranks: Ranks, model, tokenizer, path: Path) -> None:
    """Every rank: the final model in Hugging Face format at ``path`` (gathered to rank 0, which
    writes it; the others wait)."""
    if not ranks.sharded:
        save_model(model, tokenizer, path)
        return
    weights = full_state_dict(model, keep=ranks.is_main)
    if ranks.is_main:
        save_model(model, tokenizer, path, state_dict=weights)
    ranks.wait_for_main()
