"""What a study keeps of each run and how it concludes: the run's record (its validation numbers
and training curve from its log, what it ran on, its measurements' summaries), its evaluated
completions (``completions.jsonl.gz`` beside the record: every response the harness scored, so
the study's counts can be recomputed and its tables rescored, ``benchmarks.study.evidence``), the check
that one study never mixes devices, the selection of each method's setting on validation, and the
git commit of finished records."""

from __future__ import annotations

import gzip
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.study.config import StudyConfig
from benchmarks.study.plan import Run, trainer_of
from eval import SUMMARY_SUFFIX
from trainers.common.config import ConfigError
from trainers.common.models import resolve_device
from trainers.common.run_dir import RUNTIME_FILE, read_jsonl

def final_evaluation(log: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The held-out record of the run's final model: the one at its last iteration (None when that
    model was never measured, e.g. killed during its evaluation)."""
    train = [r for r in log if "reward_mean" in r]
    last = train[-1]["iteration"] if train else 0
    return next((r for r in reversed(log) if "eval_reward" in r and r["iteration"] == last), None)


def validation_result(run: Run) -> dict[str, Any]:
    """The run's final held-out numbers on the validation split and its training curve, from its log."""
    log = read_jsonl(run.path / "log.jsonl")
    train = [r for r in log if "reward_mean" in r]
    last = final_evaluation(log)
    if last is None:
        raise ConfigError(f"{run.path}: its log has no held-out evaluation of the final model (iteration "
                          f"{train[-1]['iteration'] if train else 0}); resume the run to measure it")
    return {"eval_pass@1": last.get("eval_pass@1"), "eval_reward": last.get("eval_reward"),
            "curve_samples": [r["samples"] for r in train], "curve_reward": [r["reward_mean"] for r in train],
            "samples": train[-1]["samples"] if train else 0, "seconds": sum(r.get("seconds", 0.0) for r in train),
            "cpu_seconds": cpu_seconds(train)}


def cpu_seconds(log: list[dict[str, Any]]) -> float | None:
    """The process CPU seconds (all its threads) of a run's logged iterations; None for a log from before
    they were recorded. Unlike wall seconds, another job sharing the CPU barely changes it."""
    if not log or any("cpu_seconds" not in r for r in log):
        return None
    return sum(r["cpu_seconds"] for r in log)


def training_runtime(run: Run) -> list[str]:
    """What the run trained with, per start and resume: the distinct "device dtype" pairs it recorded."""
    return list(dict.fromkeys(f"{r['device']} {r['dtype']}" for r in read_jsonl(run.path / RUNTIME_FILE)))


def training_machines(run: Run) -> list[dict]:
    """The machines the run trained on (``hardware.describe``: CPU, its bf16 units, the GPU), per
    start and resume."""
    seen = {json.dumps(r["machine"], sort_keys=True) for r in read_jsonl(run.path / RUNTIME_FILE) if "machine" in r}
    return [json.loads(m) for m in sorted(seen)]


def shared_prefix_of(run: Run) -> str | None:
    """Whether an RL run computed each group's prompt once ("on"/"off"; None for ES)."""
    if run.method.startswith("es_") or not (run.path / "config.yaml").is_file():
        return None
    from trainers.rl.loop import uses_shared_prefix

    cfg = trainer_of(run.method).resolve(["--resume", str(run.path)])
    return "on" if uses_shared_prefix(cfg) else "off"


def training_engines(run: Run) -> list[str]:
    """The engines the run generated with, per start and resume (runs recorded before: none)."""
    return list(dict.fromkeys(r["engine"] for r in read_jsonl(run.path / RUNTIME_FILE) if "engine" in r))


def recorded_devices(out: Path) -> dict[str, str]:
    """Device type -> one place that recorded it, over the study's runs and evaluations so far."""
    found: dict[str, str] = {}
    for path in sorted(out.glob(f"runs/*/*/*/{RUNTIME_FILE}")):
        for r in read_jsonl(path):
            found.setdefault(r["device"], str(path.parent))
    for path in sorted(out.rglob("summary.json")):
        device = json.loads(path.read_text()).get("device")
        if device:
            found.setdefault(device, str(path.parent))
    return found


def check_device(cfg: StudyConfig, out: Path) -> None:
    """A study resumed on another kind of device would mix numerics in one table (the default dtype
    follows the device, and kernels differ): refused, naming where the earlier work ran."""
    try:
        device = resolve_device(cfg.device).type
    except ValueError as exc:
        raise ConfigError(f"--device: {exc}") from None
    other = {d: where for d, where in recorded_devices(out).items() if d != device}
    if other:
        used, where = next(iter(other.items()))
        raise ConfigError(f"--out {out}: its runs and evaluations so far ran on {used} ({where}), this invocation "
                          f"would run on {device}, and one table must not mix their numerics: pass --device {used}, "
                          f"or use another --out")



def run_record(run: Run, splits: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """The record of a trained run, before its measurements are added: its setting, its validation
    numbers and curve, what it trained on, and its splits' examples and distinct prompts."""
    return {"method": run.method, "label": run.label, "setting": run.setting, "hparams": run.hparams,
            **({"extension": run.extension} if run.extension else {}),
            "seed": run.seed, "run": str(run.path), "validation": validation_result(run),
            "runtime": training_runtime(run), "engines": training_engines(run),
            "machines": training_machines(run), "shared_prefix": shared_prefix_of(run),
            **({"splits": splits} if splits else {})}


#: The file of a run's (or the base model's) evaluated completions, beside its record.
COMPLETIONS = "completions.jsonl.gz"
#: What the committed completions keep of each harness row (token ids and timings are not evidence).
ROW_KEYS = ("id", "sample", "opening", "completion", "reward", "correct", "parts", "error", "tokens", "finished", "kl")


def harness_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-response rows the harness wrote beside ``summary`` (its ``file``); a clear error
    where they are gone (a study measured before its completions were kept, then cleaned)."""
    file = Path(summary.get("file") or "")
    rows = file.with_name(file.name.removesuffix(SUMMARY_SUFFIX) + ".jsonl")
    if not rows.is_file():
        raise ConfigError(f"{rows}: the harness's responses are missing, so the completions cannot be kept; "
                          f"delete {file.parent} to measure again")
    return [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]


def write_completions(path: Path, measured: dict[str, dict[str, Any]]) -> Path:
    """Write ``path`` (gzipped JSONL, byte-stable): one line per response of every measurement in
    ``measured`` (eval name -> harness summary), tagged with the eval's name."""
    lines = []
    for name, summary in measured.items():
        for row in harness_rows(summary):
            lines.append(json.dumps({"eval": name, **{k: row[k] for k in ROW_KEYS if k in row}},
                                    ensure_ascii=False) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write("".join(lines).encode())
    tmp.replace(path)
    return path


def keep_completions(path: Path, measured: dict[str, dict[str, Any]]) -> Path | None:
    """``write_completions`` unless ``path`` exists; where the harness's responses are gone (a study
    measured before completions were kept, resumed in a fresh clone) a one-line warning, and None."""
    if path.is_file():
        return path
    try:
        return write_completions(path, measured)
    except ConfigError as exc:
        tqdm.write(f"warning: {exc}")
        return None


def read_completions(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``completions.jsonl.gz``."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def brief(summary: dict[str, Any]) -> dict[str, Any]:
    """What the study keeps of a harness summary (``reward_se``: the study's standard error of its mean
    reward over distinct prompts, ``benchmarks.study.errors``, where measured)."""
    keys = ("env", "split", "method", "base_model", "hparams", "seed", "samples", "temperature", "max_new_tokens",
            "n", "responses", "pass@1", "pass@k", "pass^k", "correct_rate", "reward_mean", "reward_std", "parts_mean", "kl_mean",
            "kl_std", "kl_estimator", "errors", "device", "dtype", "engine", "machine", "file")
    return {k: summary.get(k) for k in keys} | ({"reward_se": summary["reward_se"]} if "reward_se" in summary else {})



def select(cfg: StudyConfig, records: list[dict[str, Any]], methods: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per method (``methods``, default the study's), the setting with the best mean validation metric
    over seeds (ties: the other metric). Test numbers play no part."""
    other = "eval_reward" if cfg.metric == "eval_pass@1" else "eval_pass@1"
    chosen = {}
    for method in methods or cfg.method_list:
        by_setting: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            if r["method"] == method:
                by_setting.setdefault(r["setting"], []).append(r)
        for r in (r for rs in by_setting.values() for r in rs):
            missing = [m for m in (cfg.metric, other) if r["validation"].get(m) is None]
            if missing:  # never a stand-in number: with negative rewards, 0.0 would win the selection
                raise ConfigError(f"{r.get('run', method)}: no validation {missing[0]}, so its setting cannot be "
                                  f"selected")
        score = {s: (float(np.mean([r["validation"][cfg.metric] for r in rs])),
                     float(np.mean([r["validation"][other] for r in rs]))) for s, rs in by_setting.items()}
        best = max(score, key=score.get)
        chosen[method] = {"setting": best, "validation": {cfg.metric: score[best][0], other: score[best][1]},
                          "all": {s: {cfg.metric: v[0], other: v[1]} for s, v in score.items()}}
    return chosen



def pinned_rule(commit_id: str) -> str:
    """``--rule-commit``: the full id of the commit that holds a study's pre-registered rule; a commit
    that is unknown, or not in this checkout's history, or without ``benchmarks/study/verdicts.py``,
    is a clear error."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], capture_output=True, text=True)

    found = git("rev-parse", "--verify", "--quiet", f"{commit_id}^{{commit}}")
    if found.returncode:
        raise ConfigError(f"--rule-commit {commit_id}: no such commit in this repository")
    full = found.stdout.strip()
    if git("merge-base", "--is-ancestor", full, "HEAD").returncode:
        raise ConfigError(f"--rule-commit {commit_id}: not in this checkout's history (HEAD must contain the rule)")
    if git("cat-file", "-e", f"{full}:benchmarks/study/verdicts.py").returncode:
        raise ConfigError(f"--rule-commit {commit_id}: holds no benchmarks/study/verdicts.py")
    return full


def commit(paths: list[Path], message: str) -> None:
    """``git commit`` exactly ``paths`` (the study's small result files) with ``message``; anything
    else staged stays staged. A failure (no repository, the index locked by another git command)
    is reported in one line and never stops the study: the next commit picks the files up."""
    files = [str(p) for p in paths if Path(p).is_file()]
    if not files:
        return
    for attempt in range(3):
        added = subprocess.run(["git", "add", "--", *files], capture_output=True, text=True)
        done = added if added.returncode else subprocess.run(["git", "commit", "-q", "-m", message, "--", *files],
                                                             capture_output=True, text=True)
        if done.returncode == 0 or "nothing" in done.stdout + done.stderr:
            return
        time.sleep(2 + 3 * attempt)  # another git command holds the index: try again shortly
    tqdm.write(f"warning: could not commit {len(files)} study files ({(done.stderr or done.stdout).strip()[:200]})")

