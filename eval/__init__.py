"""The evaluation harness: every model, fine-tuned by any trainer or not at all, measured the same way.

    python -m eval --env Countdown-v0 --model RUN_OR_MODEL      # measure (pass@1, pass@k, KL)
    python -m eval.table RESULTS_OR_RUNS ...                     # Table 1 / Table 2 / MATH table
    python -m eval.plot RESULTS_OR_RUNS ... --out plots/         # curves, Pareto front, improvement

This module holds the light shared parts: what a ``--model`` argument names (a plain model or a
trainer run, its method and base model) and reading result files back. Heavy imports stay lazy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Table 1's method columns, in the paper's order; other labels follow in order of appearance.
METHOD_ORDER: tuple[str, ...] = ("Original", "PPO", "GRPO (8)", "GRPO (30)", "GRPO", "GRPO-verl", "Dr.GRPO", "ES", "ES (full-rank)",
                                  "ES (low-rank)")
#: Config keys that are a run's hyperparameters in Table 2 (first present name of each group).
HPARAM_KEYS: tuple[tuple[str, ...], ...] = (("beta", "kl_coef", "kl_beta"), ("lr", "learning_rate"), ("alpha",),
                                            ("sigma",))
#: Display names of model aliases. The default model is the Q4_1 GGUF of SmolLM2-135M-Instruct
#: dequantised (``trainers.common.models``), not the hub's bf16 weights, and its numbers differ: the
#: label says so, so that it is never mistaken for "HuggingFaceTB/SmolLM2-135M-Instruct".
DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct (Q4_1 GGUF)"
MODEL_NAMES = {"smollm2-135m": DEFAULT_MODEL_LABEL, "smollm2-135m-instruct": DEFAULT_MODEL_LABEL}
SUMMARY_SUFFIX = ".summary.json"


@dataclass
class ModelSpec:
    """What ``--model`` names: the weights to load and, for a trainer run, where they came from."""

    path: str  # what load_model gets
    method: str = "Original"
    base_model: str = ""
    run: str | None = None
    iteration: int | None = None  # a checkpoint's iteration; None for a final or plain model
    seed: int | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def model_name(name: str) -> str:
    """A short display name: an alias's model name, a hub id's last part, a directory's name."""
    if name.lower() in MODEL_NAMES:
        return MODEL_NAMES[name.lower()]
    path = Path(name)
    if path.name in ("final", "") or path.parent.name == "checkpoints":
        return name
    return path.name


def canonical_method(name: str, config: dict[str, Any] | None = None) -> str | None:
    """``"es"`` -> ``"ES"``, ``"dr_grpo"`` -> ``"Dr.GRPO"``, ``"grpo"`` -> ``"GRPO (8)"`` (with the
    config's group size), ...; None for a name that is not a known method."""
    key = re.sub(r"[^a-z]", "", name.lower())
    config = config or {}
    if key in ("es", "evolutionstrategies", "evolutionstrategy"):
        return "ES"
    if key == "ppo":
        return "PPO"
    if key in ("drgrpo", "drgrpoverl"):
        return "Dr.GRPO"
    if key in ("grpo", "bnpo", "grpoz"):
        group = next((config[k] for k in ("group_size", "num_generations", "generations") if config.get(k)), None)
        return f"GRPO ({group})" if group else "GRPO"
    if key in ("grpoverl", "grpov"):
        return "GRPO-verl"
    if key in ("original", "base", "none"):
        return "Original"
    return None


def infer_method(config: dict[str, Any], run_name: str = "") -> str:
    """The method of a trainer run from its config.yaml: the ``algorithm`` every trainer here
    records, else another explicit name, RL loss type or ES hyperparameters (runs of other
    code), else the run directory's name (``es-...``, ``grpo-...``); "(LoRA r=R)" added for a run
    that trained adapters."""
    return with_lora_label(_method_of(config, run_name), config)


def _method_of(config: dict[str, Any], run_name: str) -> str:
    for key in ("algorithm", "method", "trainer", "loss_type", "loss"):
        value = config.get(key)
        if isinstance(value, str) and canonical_method(value, config):
            return canonical_method(value, config)
    if "population" in config and "sigma" in config:
        return "ES"
    prefix = re.split(r"[-_]", Path(run_name).name, maxsplit=1)[0]
    return canonical_method(prefix, config) or "unknown"


def with_lora_label(method: str, config: dict[str, Any]) -> str:
    """A run trained LoRA adapters (``lora_rank`` > 0 in its config): its method says so, e.g. "ES (LoRA r=8)"."""
    rank = config.get("lora_rank") or 0
    return f"{method} (LoRA r={rank})" if isinstance(rank, int) and rank > 0 else method


def hparams_of(config: dict[str, Any], method: str) -> dict[str, Any]:
    """The hyperparameters Table 2 groups runs by (seed excluded)."""
    out = {}
    for names in HPARAM_KEYS:
        for name in names:
            if config.get(name) is not None and (method.startswith("ES") or name not in ("alpha", "sigma")):
                out[name] = config[name]
                break
    return out


def is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and ((path / "log.jsonl").is_file() or (path / "final").is_dir())


def describe_model(spec: str, label: str | None = None) -> ModelSpec:
    """Resolve ``--model``: a trainer run directory (its ``final/`` model), a run's checkpoint
    (``RUN/checkpoints/K``) or ``RUN/final``, or anything ``load_model`` takes (method Original).
    Raises ``FileNotFoundError`` for a run without a final model."""
    path = Path(spec).expanduser()
    run, iteration, weights = None, None, spec
    if path.is_dir() and is_run_dir(path):
        run, weights = path, str(path / "final")
        if not (path / "final").is_dir():
            raise FileNotFoundError(f"run {spec} has no final/ model yet (still training?); "
                                    f"pass one of its checkpoints, {spec}/checkpoints/K")
    elif path.is_dir() and path.parent.name == "checkpoints" and is_run_dir(path.parent.parent):
        run, iteration = path.parent.parent, int(path.name) if path.name.isdigit() else None
    elif path.is_dir() and path.name == "final" and is_run_dir(path.parent):
        run = path.parent
    if run is None:
        return ModelSpec(path=spec, method=label or "Original", base_model=spec)
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    method = infer_method(config, run.name)
    return ModelSpec(path=weights, method=label or method, base_model=str(config.get("model", "?")), run=str(run),
                     iteration=iteration, seed=config.get("seed"), hparams=hparams_of(config, method), config=config)


# ----- reading results back -----------------------------------------------------------------------


def load_results(paths: list[str]) -> list[dict[str, Any]]:
    """Summary records from result files (``*.summary.json``) and directories searched for them.

    A trainer run directory with no harness results contributes its own held-out evaluations
    from log.jsonl (the first as Original, the last as the run's method; ``source: "log"``).
    Raises ``FileNotFoundError`` for a path that does not exist or holds nothing to read.
    """
    records, seen = [], set()
    for arg in paths:
        path = Path(arg).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{arg}: no such result file, run or directory")
        found = []
        if path.is_file():
            found = _read_summary(path)
        else:
            for file in sorted(path.rglob(f"*{SUMMARY_SUFFIX}")):
                if file.resolve() not in seen:
                    seen.add(file.resolve())
                    found += _read_summary(file)
            for run in find_runs([arg]):
                if not any(run.glob(f"eval/*{SUMMARY_SUFFIX}")) and run.resolve() not in seen:
                    seen.add(run.resolve())
                    found += records_from_log(run)
        if not found:
            raise FileNotFoundError(f"{arg}: holds no evaluation results (*{SUMMARY_SUFFIX}) and no trainer run")
        records += found
    return records


def find_runs(paths: list[str]) -> list[Path]:
    """Trainer run directories among ``paths`` and below them."""
    runs: list[Path] = []
    for arg in paths:
        path = Path(arg).expanduser()
        if path.is_dir():
            candidates = [path] + sorted(p.parent for p in path.rglob("config.yaml"))
            runs += [c for c in candidates if is_run_dir(c) and c not in runs]
    return runs


def _read_summary(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FileNotFoundError(f"{path}: not a readable result file ({exc})") from None
    items = data.get("results", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(r, dict) and "env" in r for r in items):
        raise FileNotFoundError(f"{path}: not an eval summary (expected records with 'env', 'pass@1', ...)")
    return [{**r, "file": str(path)} for r in items]


def read_log(run: Path) -> list[dict[str, Any]]:
    from trainers.common.run_dir import read_jsonl

    return read_jsonl(run / "log.jsonl")


def records_from_log(run: Path) -> list[dict[str, Any]]:
    """Pseudo summary records from a run's own held-out evaluations (greedy pass@1 on its
    eval split, measured by the trainer): the first one as Original, the last as the run."""
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    evals = [r for r in read_log(run) if "eval_pass@1" in r]
    if not evals:
        return []
    method = infer_method(config, run.name)
    common = dict(env=config.get("env", "?"), split=config.get("eval_split", "test"), base_model=str(config.get("model", "?")),
                  samples=1, temperature=0.0, max_new_tokens=_generation_budget(config), source="log",
                  file=str(run / "log.jsonl"))
    out = []
    if evals[0].get("iteration") == 0:
        out.append(dict(common, method="Original", model=str(config.get("model", "?")), run=None, iteration=None,
                        **_log_scores(evals[0], config)))
    last = evals[-1]
    if last.get("iteration", 0) > 0:
        done = last["iteration"] >= (config.get("iterations") or 0) and (run / "final").is_dir()
        out.append(dict(common, method=method, model=str(run / "final"), run=str(run), seed=config.get("seed"),
                        iteration=None if done else last["iteration"], hparams=hparams_of(config, method),
                        **_log_scores(last, config)))
    return out


def _log_scores(record: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    return {"pass@1": record["eval_pass@1"], "correct_rate": record["eval_pass@1"],
            "reward_mean": record.get("eval_reward"), "n": record.get("eval_n", config.get("eval_limit"))}


def _generation_budget(config: dict[str, Any]) -> int | None:
    """A run's max_new_tokens: its config's, else (older runs wrote null) its env's default."""
    if config.get("max_new_tokens"):
        return config["max_new_tokens"]
    import llm_envs

    try:
        return llm_envs.registry.env_class(str(config.get("env"))).max_new_tokens
    except llm_envs.UnknownEnvError:
        return None
