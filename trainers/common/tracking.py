"""Experiment tracking: what a run logs, sent as it is logged to TensorBoard (the default), Weights &
Biases or Trackio, through those libraries themselves (``--report-to``: one of them, a comma list,
or ``none``; W&B and Trackio are the ``tracking`` extra, ``pip install 'llm-envs[tracking]'``).

Every trainer logs through ``RunDir.log`` (``run_dir.py``), which hands each record here; the eval
harness and the study use ``Tracker`` the same way. No algorithm's file knows a backend.

- **One vocabulary** (``VOCABULARY``): ES, GRPO, Dr.GRPO and PPO log the same names for the same
  things, so runs of different methods share a chart: ``train/reward``, ``train/pass@1`` (the
  share of correct training responses), ``train/kl`` (RL's per-token KL to the reference),
  ``eval/reward``, ``eval/pass@1`` (held-out, greedy), ``perf/tokens_per_second`` (generated
  tokens over the step's seconds), ``perf/seconds_per_step``, ``perf/peak_memory_gb`` (the
  process's peak: CUDA's allocated memory on a GPU, the resident set on a CPU) and the budget
  ``train/samples`` / ``train/tokens``; every other number keeps its log.jsonl name under
  ``train/`` (``eval/`` for ``eval_...``). The step is the iteration (ES) or optimizer step (RL).
- **The config** of a tracked run is its config.yaml and what runtime.jsonl records of its start
  (the machine, dtype and engine); **a group** (``--report-group``; a study and a sweep set theirs)
  gathers runs, each of which belongs to it.
- **W&B** runs online where credentials are found (``WANDB_API_KEY``, or ``wandb login``'s netrc
  entry), else offline, saying where its files are and how to upload them (``wandb sync``);
  ``WANDB_MODE`` decides instead when set. **Trackio** runs locally only (its SQLite files in
  ``$TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``; ``trackio show`` opens its
  dashboard): no Space or server is used even when its variables are set, and the Hugging Face
  hub is not asked who the user is.

``RUN/tracking.json`` keeps a run's name and W&B id, so a resumed run continues the same tracked run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import netrc
import os
import resource
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

BACKENDS = ("tensorboard", "wandb", "trackio")
NONE = "none"
#: The optional dependencies W&B and Trackio come with (pyproject.toml).
EXTRA = "tracking"
PROJECT = "llm-envs"
STATE_FILE = "tracking.json"
REPORT_TO_HELP = (f"where the run's metrics go besides log.jsonl: {', '.join(BACKENDS)} or {NONE}, or a comma list "
                  f"(wandb: online with credentials, else offline; trackio: local files). wandb and trackio need "
                  f"pip install 'llm-envs[{EXTRA}]'")
GROUP_HELP = "tracking group the run belongs to (a study and a sweep set theirs)"

#: What every method's log.jsonl calls a thing -> the one name every backend shows it under.
VOCABULARY = {"reward_mean": "train/reward", "accuracy": "train/pass@1", "kl": "train/kl",
              "seconds": "perf/seconds_per_step", "samples": "train/samples", "tokens": "train/tokens",
              "eval_reward": "eval/reward", "eval_pass@1": "eval/pass@1", "eval_n": "eval/n"}


class TrackingError(ValueError):
    """A bad ``--report-to`` value, or a backend whose package is missing (the message names the extra)."""


def parse_report_to(value: str | None) -> list[str]:
    """The backends of a ``--report-to`` value (``none``: no backend; None: the default, TensorBoard)."""
    if value is None:
        return ["tensorboard"]
    names = [v.strip().lower() for v in str(value).split(",") if v.strip()]
    unknown = [n for n in names if n not in (*BACKENDS, NONE)]
    if unknown or not names:
        raise TrackingError(f"--report-to: {', '.join(unknown) or repr(value)} is not one of "
                            f"{', '.join(BACKENDS)}, {NONE} (or a comma list of them)")
    if NONE in names and len(names) > 1:
        raise TrackingError(f"--report-to: {NONE} cannot be combined with {', '.join(n for n in names if n != NONE)}")
    return list(dict.fromkeys(n for n in names if n != NONE))


def check_report_to(value: str | None) -> list[str]:
    """``parse_report_to``, then a one-line error for a backend whose package is not installed."""
    backends = parse_report_to(value)
    for name in backends:
        if name != "tensorboard" and importlib.util.find_spec(name) is None:
            raise TrackingError(f"--report-to {name}: the {name} package is not installed; "
                                f"pip install 'llm-envs[{EXTRA}]' (or pip install {name})")
    return backends


def metrics(record: dict[str, Any], previous_tokens: float | None = None) -> dict[str, float]:
    """A log record in the shared vocabulary: its numbers renamed (``VOCABULARY``, else ``train/KEY`` or
    ``eval/KEY``), and tokens per second from the step's generated tokens (``tokens_iteration``, or
    the growth of the cumulative ``tokens`` since ``previous_tokens``) over its ``seconds``."""
    out = {}
    for key, value in record.items():
        if key == "iteration" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[VOCABULARY.get(key) or (f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}")] = float(value)
    generated = record.get("tokens_iteration")
    if generated is None and "tokens" in record and previous_tokens is not None:
        generated = record["tokens"] - previous_tokens
    if generated is not None and record.get("seconds"):
        out["perf/tokens_per_second"] = float(generated) / float(record["seconds"])
    return out


def peak_memory_gb() -> float:
    """The process's peak memory: CUDA's allocated bytes when it computed on a GPU, else the peak
    resident set (Linux reports KiB, macOS bytes)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 1e9
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9


def wandb_credentials() -> bool:
    """Whether W&B would find credentials: ``WANDB_API_KEY`` (or an identity token file), or a netrc
    entry for its host (what ``wandb login`` writes)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The libraries' own banners off stdout (the tracker says what matters in one line)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


@contextlib.contextmanager
def _local_trackio() -> Iterator[None]:
    """Trackio locally and offline: its Space and server variables ignored, and the hub's offline
    switch on (a starting Trackio run asks the hub who the user is; that request then fails at once,
    in-process, and Trackio records no user name)."""
    import huggingface_hub.constants as hub

    saved = {k: os.environ.pop(k) for k in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL") if k in os.environ}
    offline, hub.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE, True
    try:
        with _quiet():
            yield
    finally:
        hub.HF_HUB_OFFLINE = offline
        os.environ.update(saved)


class Tracker:
    """The backends of one tracked run: ``log(numbers, step)`` sends already-named numbers to each,
    ``close()`` finishes them. ``directory`` holds TensorBoard's ``tb/``, W&B's ``wandb/`` and
    ``tracking.json``; ``resume`` continues the run that file names."""

    def __init__(self, backends: list[str], directory: str | Path, name: str, config: dict[str, Any],
                 group: str | None = None, job: str = "train", resume: bool = False,
                 say: Callable[[str], None] | None = None):
        self.backends, self.directory = backends, Path(directory)
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        state_file = self.directory / STATE_FILE
        state = json.loads(state_file.read_text()) if resume and state_file.is_file() else {}
        self.name = state.get("name", name)
        self._tb = self._wandb = self._trackio = None
        self.directory.mkdir(parents=True, exist_ok=True)
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.directory / "tb"))
        if "wandb" in backends:
            self._wandb = self._start_wandb(config, group, job, state.get("wandb_id"))
            state["wandb_id"] = self._wandb.id
        if "trackio" in backends:
            self._trackio = self._start_trackio(config, group, resume)
        if self._wandb or self._trackio:  # what a resume continues (TensorBoard appends to tb/ anyway)
            state_file.write_text(json.dumps({**state, "name": self.name}) + "\n")

    def _start_wandb(self, config: dict[str, Any], group: str | None, job: str, run_id: str | None):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if wandb_credentials() else "offline")
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=self.name, group=group, job_type=job,
                         config=config, dir=str(self.directory), mode=mode, id=run_id,
                         resume="allow" if run_id else None,
                         settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        files = Path(run.dir).parent
        if mode == "offline":
            why = "WANDB_MODE=offline" if os.environ.get("WANDB_MODE") else "no W&B credentials found"
            self.say(f"W&B: offline ({why}); run files in {files}; upload them with: wandb sync {files}")
        else:
            self.say(f"W&B: {mode}, {getattr(run, 'url', None) or files}")
        return run

    def _start_trackio(self, config: dict[str, Any], group: str | None, resume: bool):
        import trackio
        from trackio import utils

        project = os.environ.get("TRACKIO_PROJECT", PROJECT)
        with _local_trackio():
            run = trackio.init(project=project, name=self.name, group=group, config=config, space_id=None,
                               server_url=None, resume="allow" if resume else "never", embed=False,
                               auto_log_cpu=False, auto_log_gpu=False)
        self.say(f"Trackio: local, project {project} in {utils.TRACKIO_DIR} (see it with: trackio show --project "
                 f"{project})")
        return run

    def log(self, numbers: dict[str, float], step: int) -> None:
        """Send ``numbers`` (named in the shared vocabulary) at ``step`` to every backend."""
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        if self._trackio is not None:
            self._trackio.log(numbers, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            import wandb

            self._wandb.finish()
            wandb.teardown()  # finish returns before W&B's service has written the run's records; this waits
        if self._trackio is not None:
            import trackio

            with _local_trackio():  # through trackio.finish() while it is the current run: it forgets it then
                current = trackio.context_vars.current_run.get() is self._trackio
                trackio.finish() if current else self._trackio.finish()
        self._tb = self._wandb = self._trackio = None


def tracked_name(path: str | Path) -> str:
    """A tracked run's name: its directory as given, without a leading ``runs/`` (unique per run, and
    telling: ``study-x/runs/es_full/sigma=0.001/seed=0``)."""
    parts = Path(path).parts
    return str(Path(*parts[1:])) if len(parts) > 1 and parts[0] == "runs" else str(Path(path))
