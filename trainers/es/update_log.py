"""ES's update log (``RUN/updates.jsonl``): per iteration the seeds and coefficients of its update,
its rewards and the run's sample count. A few KB that are the whole training result: a resume
loads the newest weight checkpoint and re-applies the updates logged after it, and
``python -m trainers.es.replay`` rebuilds any iteration's weights from the base model alone.

CPU and CUDA random generators give different noise for the same seed, so the seeds rebuild the
weights only on the kind of device that drew them: ``noise_device.json`` records it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from trainers.common.budget import Budget
from trainers.common.config import ConfigError
from trainers.common.files import atomic_write
from trainers.common.run_dir import RunDir, read_jsonl

UPDATES_FILE = "updates.jsonl"
NOISE_DEVICE_FILE = "noise_device.json"


class UpdateLog:
    """The update log of ``run``; on a resume, what it holds: the last whole iteration (``done``),
    the checkpoint to load (``checkpoint``, None: the base model) and the updates after it
    (``to_replay``)."""

    def __init__(self, run: RunDir, resume: bool):
        self.run, self.path = run, run.path / UPDATES_FILE
        self.updates = read_jsonl(self.path) if resume else []
        self.done = self.updates[-1]["iteration"] if self.updates else 0
        ckpts = [k for k in run.checkpoints() if k <= self.done] if resume else []
        self.checkpoint = ckpts[-1] if ckpts else None

    def source(self, base_model: str) -> str:
        """Where the weights come from: the checkpoint's directory, else the base model."""
        return str(self.run.checkpoint_dir(self.checkpoint)) if self.checkpoint is not None else base_model

    @property
    def to_replay(self) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["iteration"] > (self.checkpoint or 0)]

    def budget(self, max_samples: int | None) -> Budget:
        """The sample budget, with what the logged iterations spent."""
        if not self.updates:
            return Budget(max_samples)
        return Budget(max_samples, self.updates[-1]["samples"], self.updates[-1].get("tokens", 0))

    def resumed(self) -> str:
        """On the main process of a resume: the metrics log cut back to ``done`` and the update log
        rewritten without a torn last line; returns the line saying where the run resumed."""
        self.run.truncate_log(self.done)
        atomic_write(self.path, "".join(json.dumps(u) + "\n" for u in self.updates))  # a kill here keeps the log
        source = f"checkpoint {self.checkpoint}" if self.checkpoint is not None else "the base model"
        return f"resumed {self.run.path} after iteration {self.done} (weights from {source})"

    def append(self, record: dict[str, Any]) -> None:
        """Log one whole iteration's update, flushed to disk: what a resume replays."""
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def check_noise_device(run_dir: Path, device: torch.device, write: bool = False) -> None:
    """Record the kind of device that draws a run's noise on its first start (``write``); refuse
    to resume or replay the run on the other kind."""
    path = Path(run_dir) / NOISE_DEVICE_FILE
    if path.is_file():
        used = json.loads(path.read_text())["device"]
        if used != device.type:
            raise ConfigError(f"{run_dir}: this run generated its noise on {used}, and CPU and CUDA random generators "
                              f"differ, so its seeds rebuild its weights only on {used} (this process uses "
                              f"{device.type}); pass --device {used} on a machine that has it")
    elif write:  # whole or not at all: the other ranks check it as it is written
        atomic_write(path, json.dumps({"device": device.type}) + "\n")
