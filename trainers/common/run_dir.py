"""A trainer's run directory, the same for every algorithm:

    RUN/config.yaml        the full config of the run
    RUN/log.jsonl          one JSON record per iteration (and per evaluation)
    RUN/tb/                TensorBoard events of the same numbers, in the shared vocabulary (``tracking.py``)
    RUN/wandb/             W&B's files, with --report-to wandb (RUN/tracking.json: the tracked run's name and id)
    RUN/updates.jsonl      ES only: seeds and coefficients of every applied update
    RUN/runtime.jsonl      per start and resume: the device type, compute and weight dtypes, engine and CPU
    RUN/checkpoints/K/     weights (Hugging Face format) after iteration K, plus trainer state
    RUN/final/             the final model (``AutoModelForCausalLM.from_pretrained`` loads it)

Files are written atomically (temp + rename) or appended line by line and flushed, so a run
killed at any moment can resume from what is on disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from trainers.common import tracking
from trainers.common.files import append_line, atomic_write

TENSORS_FILE = "tensors.safetensors"  # extra trainer tensors of a checkpoint (ES: fp32 master weights)
RUNTIME_FILE = "runtime.jsonl"  # per (re)start: the iteration it starts after, device, dtypes, engine, CPU


class RunDirError(ValueError):
    pass


class RunDir:
    def __init__(self, path: str | Path, resume: bool = False, is_main: bool = True):
        self.path = Path(path)
        self.is_main = is_main
        if is_main:
            # a directory with only a config (the run died before its first log line) may be reused
            if not resume and (self.path / "log.jsonl").exists():
                raise RunDirError(f"{self.path} already holds a run: pass --resume {self.path} or choose another --out")
            if resume and not (self.path / "config.yaml").exists():
                raise RunDirError(f"--resume {self.path}: no run there (config.yaml missing)")
            self.path.mkdir(parents=True, exist_ok=True)
        self.resume = resume
        self._config: dict[str, Any] = {}
        self._runtime: dict[str, Any] = {}
        self._tracker: tracking.Tracker | None = None
        self._tokens: float | None = None  # the budget's tokens at the last training record (tokens per second)

    # ----- config ----------------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        if self.is_main:
            atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))
            self._config = config

    def read_config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    # ----- logs ------------------------------------------------------------------------------
    def log(self, record: dict[str, Any], step: int) -> None:
        """Append ``record`` to log.jsonl, and send its numbers at ``step``, in the shared vocabulary,
        to the run's ``--report-to`` backends (TensorBoard by default; ``tracking.py``)."""
        if not self.is_main:
            return
        if self._tracker is None:
            self._tracker = self._start_tracking(step)
        append_line(self.path / "log.jsonl", record)
        numbers = tracking.metrics(record, self._tokens)
        if "tokens" in record and "reward_mean" in record:
            self._tokens = record["tokens"]
        self._tracker.log(numbers | {"perf/peak_memory_gb": tracking.peak_memory_gb()}, step)

    def _start_tracking(self, step: int) -> tracking.Tracker:
        """The run's tracker, started at its first log record: its config is config.yaml and the
        runtime record of this start (machine, dtype, engine); a resumed run continues its tracked run."""
        earlier = [r for r in self.read_log() if "tokens" in r and "reward_mean" in r and r.get("iteration", 0) < step]
        self._tokens = earlier[-1]["tokens"] if earlier else (0 if not self.resume else None)
        config = self._config or (self.read_config() if (self.path / "config.yaml").is_file() else {})
        return tracking.Tracker(tracking.parse_report_to(config.get("report_to")), self.path,
                                tracking.tracked_name(self.path), config | {"runtime": self._runtime},
                                group=config.get("report_group"), resume=self.resume, say=tqdm.write)

    def read_log(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / "log.jsonl")

    def truncate_log(self, after: int) -> None:
        """Drop log records of iterations after ``after`` (they will be redone on resume)."""
        if self.is_main and (self.path / "log.jsonl").exists():
            keep = [r for r in self.read_log() if r.get("iteration", 0) <= after]
            atomic_write(self.path / "log.jsonl", "".join(json.dumps(r) + "\n" for r in keep))

    def note_runtime(self, model, iteration: int, runtime=None, compute=None,
                     splits: dict[str, dict[str, int]] | None = None) -> None:
        """Record what this start (or resume, after ``iteration``) computes with: the device type, the
        compute dtype (``compute``, default the weights'), the weights' dtype, the run's ``runtime``
        (``runtime.Runtime``: how the dtype was decided, the probe's numbers included, the engine and
        why, the model's type and layer shape) and the machine (CPU model, its bf16 units; the GPU),
        which change the numbers and the times (a study refuses to mix devices or dtypes in one table;
        ``python -m eval`` on the run generates with the same engine), and ``splits``: each split's
        examples and distinct prompts (``splits.measured_split_counts``)."""
        if self.is_main:
            from trainers.common.hardware import describe

            p = next(model.parameters())
            resolved = runtime.record() if runtime is not None else {}
            resolved.pop("device", None)  # the weights' device, below, is where it ran
            self._runtime = {"iteration": iteration, "device": p.device.type,
                             "dtype": str(compute or p.dtype).removeprefix("torch."),
                             "weights": str(p.dtype).removeprefix("torch."), **resolved,
                             **({"splits": splits} if splits else {}), "machine": describe(p.device)}
            append_line(self.path / RUNTIME_FILE, self._runtime)

    # ----- checkpoints -----------------------------------------------------------------------
    def checkpoint_dir(self, iteration: int) -> Path:
        return self.path / "checkpoints" / f"{iteration:06d}"

    def save_checkpoint(self, model, tokenizer, iteration: int, state: dict[str, Any], keep: int = 2,
                        tensors: dict[str, Any] | None = None) -> None:
        """Weights and trainer state after ``iteration`` (plus ``tensors``, name -> tensor, in
        ``tensors.safetensors``); keeps the newest ``keep`` checkpoints."""
        if not self.is_main:
            return
        from trainers.common.models import save_model

        def state_files(directory: Path) -> None:
            if tensors:
                from safetensors.torch import save_file

                save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(directory / TENSORS_FILE))
            atomic_write(directory / "trainer_state.json", json.dumps(state))

        save_model(model, tokenizer, self.checkpoint_dir(iteration), extra=state_files)
        self.prune_checkpoints(keep)

    def prune_checkpoints(self, keep: int) -> None:
        """Delete all but the newest ``keep`` checkpoints."""
        for old in self.checkpoints()[:-keep]:
            shutil.rmtree(self.checkpoint_dir(old), ignore_errors=True)

    def checkpoints(self) -> list[int]:
        root = self.path / "checkpoints"
        if not root.exists():
            return []
        return sorted(int(d.name) for d in root.iterdir() if d.name.isdigit() and (d / "trainer_state.json").exists())

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.close()
            self._tracker = None


def summarize(run: RunDir) -> None:
    """Print the training and held-out rewards at the start and the end of the run (every trainer
    ends with it)."""
    log = run.read_log()
    train = [r for r in log if "reward_mean" in r]
    evals = [r for r in log if "eval_reward" in r]
    if train:
        k = max(1, len(train) // 5)
        first, last = np.mean([r["reward_mean"] for r in train[:k]]), np.mean([r["reward_mean"] for r in train[-k:]])
        tqdm.write(f"training reward (mean of first/last {k} iterations): {first:.4f} -> {last:.4f}")
    if len(evals) >= 2:
        a, b = evals[0], evals[-1]
        tqdm.write(f"held-out reward: {a['eval_reward']:.4f} -> {b['eval_reward']:.4f}; "
                   f"pass@1: {a['eval_pass@1']:.3f} -> {b['eval_pass@1']:.3f}")
    tqdm.write(f"final model: {run.path / 'final'}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (a kill mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def recorded_engine(run_dir: str | Path) -> str | None:
    """The engine a run generated with at its last start (``runtime.jsonl``), or None when it did
    not record one (runs older than the record)."""
    engines = [r["engine"] for r in read_jsonl(Path(run_dir) / RUNTIME_FILE) if "engine" in r]
    return engines[-1] if engines else None


def recorded_dtype(path: str | Path) -> str | None:
    """The compute dtype the run at ``path`` recorded at its first start ("float32", "bfloat16"), or
    None (no record yet)."""
    records = read_jsonl(Path(path) / RUNTIME_FILE)
    return records[0].get("dtype") if records else None


def recorded_runtime(run_dir: str | Path | None) -> dict[str, Any]:
    """What the run at ``run_dir`` recorded at its first start, as ``runtime.resolve`` takes it:
    ``dtype`` (``fp32``/``bf16``) and ``engine``; empty for no run or one that recorded nothing yet."""
    if not run_dir:
        return {}
    from trainers.common.precision import dtype_name, parse_dtype

    out = {}
    dtype = recorded_dtype(run_dir)
    if dtype:
        out["dtype"] = dtype_name(parse_dtype(dtype))
    engine = recorded_engine(run_dir)
    if engine:
        out["engine"] = engine
    return out
