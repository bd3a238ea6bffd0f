"""Test the paper's claims in one command: ES (full-rank and low-rank) against GRPO, Dr.GRPO and PPO
on one environment, over seeds and small hyperparameter grids, at an equal sample budget.

    python -m benchmarks.study --env Conciseness-v0 --seeds 4 --max-samples 256 --out runs/study
    python -m benchmarks.study --config benchmarks/configs/study_conciseness_cpu.yaml
    python -m benchmarks.study --config benchmarks/configs/study_countdown_qwen2.5-7b.yaml  # the paper's GPU setting

The protocol, as in the paper:
- Every method trains the same model on the same environment, training prompts, generation budget
  (``--max-new-tokens``) and held-out split, and generates the whole steps that fit
  ``--max-samples`` (no run exceeds it); methods whose actual budgets differ by more than one step
  of the method with the smallest step are refused unless ``--unequal-budgets``, and the tables
  report each method's actual training responses.
- ES runs one fixed setting per sigma of a small grid (``--sigmas``), alpha = ``--alpha-ratio`` x
  sigma (the paper's Conciseness runs: sigma/2). The RL methods run the grid beta x learning rate
  (``--betas`` with a beta = 0 arm, ``--lrs``). Every grid point runs every seed and is recorded.
- Each method's setting is selected on a validation split, never on the test split: the env's own
  ``validation`` split, else one carved from train (``--val-size``), else, for train splits too
  small to carve (Conciseness-v0 has 2 prompts), the training prompts themselves.
- Every final model and the base model are measured by the eval harness (``eval.harness``) on the
  test split: greedy pass@1, and ``--kl-samples`` sampled responses per prompt at temperature 1
  with KL to the base model (Conciseness-v0: the paper's 20).

Writes under OUT: ``table1.md`` (test pass@1 per method, mean ± std over seeds, at its selected
setting), ``table2.md`` (the paper's Table 2 layout: reward and KL, mean ± std over seeds, per
method and setting), ``runs.md`` (every run: validation, test, KL, reward-hacking flag),
``seed_variance.md``, ``pareto-ENV-SPLIT.png`` (every seed's model, each method's front),
``curves.png`` (training reward against samples, mean and band over seeds) and ``results.json``
(every number). Runs live in OUT/runs/METHOD/SETTING/seed=S, evaluations in OUT/evals. A killed
study resumes where it stopped when run again with the same arguments: finished runs and
evaluations are not redone, an unfinished run resumes from its last checkpoint.

Several processes (``torchrun --nproc-per-node G -m benchmarks.study ...``): every run trains on all
G processes (ES: members split over them, one engine each; RL: FSDP2), and process 0 alone runs
the harness's measurements and writes the records and the report while the others wait. ES runs
give the numbers of one process bit for bit, RL runs agree within float rounding
(``docs/scale-out.md``). The harness on process 0 cannot build a vLLM engine inside the others'
launch (vLLM's engine in a launched group joins every rank), so ``--engine vllm`` is refused there.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import llm_envs
from benchmarks.study_report import ORIGINAL, hacked, write_report
from trainers.common import distributed
from trainers.common.config import (ConfigError, build_config, check, check_engine, env_kwargs, make_env,
                                    parse_config, run_main)
from trainers.common.files import atomic_write
from trainers.common.models import DTYPE_CHOICES, default_dtype, dtype_name, resolve_device
from trainers.common.run_dir import RUNTIME_FILE, read_jsonl
from trainers.common.splits import MIN_VALIDATION, VALIDATION
from trainers.engines import ENGINE_FIELDS, ENGINES, EngineOptions
from trainers.engines.bars import bar as progress_bar
from trainers.engines.options import ENGINES_HELP

METHODS = ("es_full", "es_lowrank", "es_sampled", "grpo", "dr_grpo", "ppo")
#: The methods a study runs unless --methods names others (es_sampled is the optional one).
DEFAULT_METHODS = ("es_full", "es_lowrank", "grpo", "dr_grpo", "ppo")
#: How tables and plots name each method.
LABELS = {"es_full": "ES (full-rank)", "es_lowrank": "ES (low-rank)", "es_sampled": "ES (low-rank, sampled)",
          "grpo": "GRPO", "dr_grpo": "Dr.GRPO", "ppo": "PPO"}
#: The study's default engine: native where it runs (no start-up cost, and 1.2-5x HF on this CPU),
#: else hf; vLLM generates faster but takes ~20 s to start for each training run and evaluation.
AUTO_ENGINE = "auto"
#: Options that say how this invocation runs, not what the runs are: not part of a study's identity,
#: and passed again to an unfinished run when it resumes.
INVOCATION = ("device", "grad_accum", "commit", *(name for name in ENGINE_FIELDS if name != "engine"))


@dataclass
class StudyConfig(EngineOptions):
    engine: str = field(default=AUTO_ENGINE, metadata={
        "help": f"generation engine of every run and evaluation: auto (native for a Llama/Qwen2 model on CPU, hf "
                f"otherwise), {ENGINES_HELP}", "choices": [AUTO_ENGINE, *ENGINES]})
    env: str = field(default="Conciseness-v0", metadata={"help": "environment id ('my_module:My-v0' imports my_module)"})
    seeds: int = field(default=4, metadata={"help": "seeds per method and setting (runs use seeds 0..K-1)"})
    max_samples: int = field(default=256, metadata={"help": "generated training responses per run, the same for "
                                                            "every method (no run exceeds it)"})
    model: str = field(default="smollm2-135m", metadata={"help": "base model: Hugging Face id, local directory, or smollm2-135m"})
    out: str | None = field(default=None, metadata={"help": "study directory (default runs/study-ENV-TIME); "
                                                            "running again with the same --out resumes"})
    methods: str = field(default=",".join(DEFAULT_METHODS), metadata={
        "help": f"comma-separated subset of {', '.join(METHODS)} (es_sampled: low-rank ES whose members are "
                f"measured on --es-samples sampled responses per prompt)"})
    sigmas: str = field(default="5e-4,1e-3", metadata={"help": "ES sigma grid, one setting each"})
    alpha_ratios: str = field(default="0.5", metadata={"help": "ES alpha = ratio x sigma, a grid (the paper's "
                                                                 "Conciseness: 0.5); with several, sigma x ratio"})
    population: int = field(default=8, metadata={"help": "N of full-rank ES"})
    lowrank_population: int = field(default=32, metadata={"help": "N of low-rank ES (one batched generation per iteration)"})
    rank: int = field(default=1, metadata={"help": "R of low-rank ES"})
    es_samples: int = field(default=4, metadata={"help": "es_sampled: sampled responses per prompt and member"})
    es_temperature: float = field(default=1.0, metadata={"help": "es_sampled: members' sampling temperature"})
    mirrored: bool = field(default=True, metadata={"help": "ES antithetic pairs"})
    betas: str = field(default="0,1e-3", metadata={"help": "RL KL-coefficient grid (include 0: the no-KL arm)"})
    lrs: str = field(default="1e-6,1e-5", metadata={"help": "RL learning-rate grid"})
    group_size: int = field(default=8, metadata={"help": "RL responses per prompt (GRPO's G; PPO samples as many)"})
    grad_accum: int = field(default=1, metadata={"help": "RL micro-batches per step (gradient accumulation): the same "
                                                          "update in less memory"})
    batch_size: int | None = field(default=None, metadata={"help": "training prompts per ES iteration and RL step "
                                                                   "(default: the whole train split, at most 8, and few "
                                                                   "enough that one step of every method fits --max-samples)"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "generation budget of training and evaluation (default: the env's)"})
    metric: str | None = field(default=None, metadata={"help": "validation metric a setting is selected by (default: "
                                                                "eval_reward for Conciseness-v0, else eval_pass@1)",
                                                        "choices": ["eval_pass@1", "eval_reward"]})
    val_size: int | None = field(default=None, metadata={"help": "validation examples carved from train (default: 10%, "
                                                                 f"at least {MIN_VALIDATION}, when train is large enough)"})
    eval_split: str = field(default="test", metadata={"help": "the split the study reports"})
    eval_limit: int | None = field(default=None, metadata={"help": "measure the first K examples of the validation and test splits"})
    kl_samples: int | None = field(default=None, metadata={"help": "sampled responses per test prompt for reward and KL "
                                                                   "(default: 20 for Conciseness-v0, else 1; 0: none)"})
    env_args: str | None = field(default=None, metadata={"help": "JSON object of environment options"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda (default: cuda if available)"})
    dtype: str | None = field(default="auto", metadata={
        "help": "compute dtype of every run and evaluation: auto (a resumed study's own; else bf16 on CUDA and on a "
                "CPU with bf16 matrix units, fp32 elsewhere), fp32 or bf16; one study never mixes dtypes",
        "choices": DTYPE_CHOICES})
    keep_weights: bool = field(default=False, metadata={"help": "keep every run's final model (default: deleted once measured)"})
    commit: bool = field(default=False, metadata={"help": "git-commit each finished run's record, the base model's "
                                                          "summaries and the report as they are written (for a study "
                                                          "under docs/ that runs over several sittings: a fresh clone "
                                                          "resumes where the commits stop)"})
    unequal_budgets: bool = field(default=False, metadata={"help": "accept methods whose actual training responses "
                                                                   "(whole steps within --max-samples) differ by more "
                                                                   "than one step of the method with the smallest step"})

    def validate(self) -> None:
        try:
            env_id = llm_envs.registry.resolve_id(self.env)
        except llm_envs.UnknownEnvError as exc:
            raise ConfigError(f"--env: {exc}") from None
        unknown = [m for m in self.method_list if m not in METHODS]
        check(not unknown, "methods", f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
        check(bool(self.method_list), "methods", "name at least one method")
        check(self.seeds >= 1, "seeds", "must be >= 1")
        check(self.max_samples >= 1, "max_samples", "must be >= 1")
        for name in ("sigmas", "alpha_ratios", "betas", "lrs"):
            values = self.grid(name)
            check(all(math.isfinite(v) for v in values), name, "must be finite numbers")
        check(all(s > 0 for s in self.grid("sigmas")), "sigmas", "must be > 0")
        check(all(b >= 0 for b in self.grid("betas")), "betas", "must be >= 0")
        check(all(lr > 0 for lr in self.grid("lrs")), "lrs", "must be > 0")
        check(all(a > 0 for a in self.grid("alpha_ratios")), "alpha_ratios", "must be > 0")
        check(self.es_samples >= 1, "es_samples", "must be >= 1")
        check(self.es_temperature > 0, "es_temperature", "must be > 0 (es_sampled samples)")
        for name in ("population", "lowrank_population"):
            check(getattr(self, name) >= 2, name, "must be >= 2")
            check(not self.mirrored or getattr(self, name) % 2 == 0, name, "must be even with --mirrored")
        check(self.rank >= 1, "rank", "must be >= 1")
        check(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        check(self.group_size >= 2, "group_size", "must be >= 2 (GRPO's advantages are relative to the group)")
        check(self.batch_size is None or self.batch_size >= 1, "batch_size", "must be >= 1")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        check(self.kl_samples is None or self.kl_samples >= 0, "kl_samples", "must be >= 0")
        check(self.eval_limit is None or self.eval_limit >= 1, "eval_limit", "must be >= 1")
        env_kwargs(self.env_args)
        check_engine(self)
        resolve_engine(self)
        if self.metric is None:
            self.metric = "eval_reward" if env_id == "Conciseness-v0" else "eval_pass@1"
        if self.kl_samples is None:
            self.kl_samples = 20 if env_id == "Conciseness-v0" else 1

    @property
    def method_list(self) -> list[str]:
        return [m.strip() for m in self.methods.split(",") if m.strip()]

    def grid(self, name: str) -> list[float]:
        try:
            return [float(v) for v in getattr(self, name).split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--{name}: expected comma-separated numbers, got {getattr(self, name)!r}") from None


# ----- the plan: every run of the study ---------------------------------------------------------------


@dataclass
class Run:
    method: str
    setting: str  # e.g. "sigma=0.001" or "beta=0_lr=1e-05"
    hparams: dict[str, float]
    seed: int
    path: Path

    @property
    def label(self) -> str:
        return LABELS[self.method]


def settings(cfg: StudyConfig, method: str) -> list[tuple[str, dict[str, float]]]:
    """The grid points of ``method``: (name, hyperparameters)."""
    if method.startswith("es_"):
        ratios = cfg.grid("alpha_ratios")
        if len(ratios) == 1:
            return [(f"sigma={s:g}", {"sigma": s, "alpha": ratios[0] * s}) for s in cfg.grid("sigmas")]
        return [(f"sigma={s:g}_alpha={r * s:g}", {"sigma": s, "alpha": r * s}) for s in cfg.grid("sigmas") for r in ratios]
    return [(f"beta={b:g}_lr={lr:g}", {"beta": b, "lr": lr}) for b in cfg.grid("betas") for lr in cfg.grid("lrs")]


def plan(cfg: StudyConfig, out: Path) -> list[Run]:
    return [Run(m, name, hp, seed, out / "runs" / m / name / f"seed={seed}")
            for seed in range(cfg.seeds) for m in cfg.method_list for name, hp in settings(cfg, m)]


def per_step(cfg: StudyConfig, method: str, prompts: int) -> int:
    """Responses one iteration (ES) or one sampled batch (RL) of ``method`` generates."""
    if method == "es_full":
        return cfg.population * prompts
    if method == "es_lowrank":
        return cfg.lowrank_population * prompts
    if method == "es_sampled":
        return cfg.lowrank_population * prompts * cfg.es_samples
    return prompts * cfg.group_size


def budget(cfg: StudyConfig, method: str, prompts: int) -> int:
    """Training responses ``method`` actually generates: the whole steps that fit ``--max-samples``."""
    step = per_step(cfg, method, prompts)
    return cfg.max_samples // step * step


def check_budgets(cfg: StudyConfig, prompts: int) -> None:
    """Refuse methods whose actual budgets differ by more than one step of the method with the smallest
    step (unless ``--unequal-budgets``): "the same sample budget" must hold for what the runs generate."""
    steps = {m: per_step(cfg, m, prompts) for m in cfg.method_list}
    used = {m: budget(cfg, m, prompts) for m in cfg.method_list}
    gap, finest = max(used.values()) - min(used.values()), min(steps.values())
    if gap > finest and not cfg.unequal_budgets:
        each = ", ".join(f"{LABELS[m]} {used[m]} ({used[m] // steps[m]} x {steps[m]})" for m in cfg.method_list)
        raise ConfigError(f"--max-samples {cfg.max_samples}: the methods' actual budgets differ by {gap} responses, "
                          f"more than one step of the smallest ({finest}): {each}; a multiple of "
                          f"{math.lcm(*steps.values())} gives all the same budget (or pass --unequal-budgets true)")


def prompts_per_step(cfg: StudyConfig, n_train: int) -> int:
    """Training prompts per ES iteration and RL step, the same for every method: ``--batch-size``, else
    the train split, at most 8, and at most what one step of the widest method can afford within
    ``--max-samples`` (a small budget such as 32 then runs with fewer prompts instead of failing)."""
    if cfg.batch_size is not None:
        return min(cfg.batch_size, n_train)
    widest = max(per_step(cfg, method, 1) for method in cfg.method_list)
    return max(1, min(8, n_train, cfg.max_samples // widest))


def validation_plan(cfg: StudyConfig, env) -> tuple[str, list[str]]:
    """The split settings are selected on, and the trainer flags that make runs evaluate there."""
    if VALIDATION in env.split_names or VALIDATION in env.data:
        return VALIDATION, ["--eval-split", VALIDATION]
    n = len(env.examples("train"))
    k = cfg.val_size or max(MIN_VALIDATION, round(0.1 * n))
    if cfg.val_size or n - k >= MIN_VALIDATION:
        if k < 1 or n - k < 1:
            raise ConfigError(f"--val-size {k}: the train split has {n} examples")
        return VALIDATION, ["--val-size", str(k), "--eval-split", VALIDATION]
    return "train", ["--eval-split", "train"]  # too small to carve: select on the training prompts


def trainer_argv(cfg: StudyConfig, run: Run, prompts: int, validation: list[str]) -> list[str]:
    argv = ["--env", cfg.env, "--model", cfg.model, "--seed", str(run.seed), "--out", str(run.path),
            "--max-samples", str(cfg.max_samples), "--batch-size", str(prompts), "--eval-every", "0", *validation]
    for name in ("max_new_tokens", "eval_limit", "env_args", "device", "dtype", *ENGINE_FIELDS):
        if getattr(cfg, name) is not None:
            argv += [f"--{name.replace('_', '-')}", str(getattr(cfg, name))]
    steps = cfg.max_samples // per_step(cfg, run.method, prompts)
    hp = {k: repr(v) for k, v in run.hparams.items()}
    if run.method.startswith("es_"):
        lowrank = run.method in ("es_lowrank", "es_sampled")
        argv += ["--iterations", str(steps), "--checkpoint-every", str(max(1, steps)),  # resume replays the seeds
                 "--population", str(cfg.lowrank_population if lowrank else cfg.population),
                 "--sigma", hp["sigma"], "--alpha", hp["alpha"], "--mirrored", str(cfg.mirrored),
                 "--noise", "lowrank" if lowrank else "full", "--rank", str(cfg.rank)]
        if run.method == "es_sampled":
            argv += ["--temperature", repr(cfg.es_temperature), "--samples-per-prompt", str(cfg.es_samples)]
    else:
        argv += ["--steps", str(steps), "--checkpoint-every", str(max(1, steps // 4)), "--group-size",
                 str(cfg.group_size), "--beta", hp["beta"], "--lr", hp["lr"], "--grad-accum", str(cfg.grad_accum)]
        argv += ["--loss", "dr_grpo"] if run.method == "dr_grpo" else []
    return argv


def trainer_of(method: str):
    name = {"es_full": "es", "es_lowrank": "es", "es_sampled": "es", "grpo": "grpo", "dr_grpo": "grpo", "ppo": "ppo"}[method]
    return __import__(f"trainers.{name}", fromlist=["resolve", "train"])


# ----- running and measuring ----------------------------------------------------------------------------


def resume_argv(run: Run, argv: list[str]) -> list[str]:
    """Resume an unfinished run from its saved config, overridden by the ``INVOCATION`` flags among
    ``argv`` (the run's trainer flags in this invocation): a study killed for memory resumes with a
    larger --grad-accum, the unfinished run included."""
    flags = {f"--{name.replace('_', '-')}" for name in INVOCATION}
    out = ["--resume", str(run.path)]
    for i, token in enumerate(argv):
        if token in flags:
            out += argv[i:i + 2]
    return out


def train_run(cfg: StudyConfig, run: Run, argv: list[str]) -> None:
    """Train ``run`` unless its final model exists and was measured; an interrupted run resumes
    (one killed while measuring its final model only measures it). Several processes: all train,
    on what process 0 found on disk."""
    dist = distributed.init()
    done = (run.path / "final").is_dir() and final_evaluation(read_jsonl(run.path / "log.jsonl")) is not None
    resuming = (run.path / "config.yaml").is_file()
    done, resuming = dist.from_main((done, resuming))
    if done:
        return
    trainer = trainer_of(run.method)
    trainer.train(trainer.resolve(resume_argv(run, argv) if resuming else argv))


def evaluations(cfg: StudyConfig) -> list[tuple[str, dict[str, Any]]]:
    """(name, eval options) of the measurements every model gets on the test split."""
    greedy = {"samples": 1, "temperature": 0.0}
    out = [("greedy", greedy)]
    if cfg.kl_samples:
        out.append(("kl", {"samples": cfg.kl_samples, "temperature": 1.0, "kl_to": "base"}))
    return out


def measure(cfg: StudyConfig, model: str, label: str | None, out: Path, options: dict[str, Any],
            cache: Path) -> dict[str, Any]:
    """One harness evaluation on the reported split (its summary is reused if already written;
    generations are cached in the study's own ``cache``)."""
    from eval.harness import EvalConfig, run

    done = out / "summary.json"
    if done.is_file():
        return json.loads(done.read_text())
    values = dict(env=cfg.env, model=model, split=cfg.eval_split, out=str(out), max_new_tokens=cfg.max_new_tokens,
                  limit=cfg.eval_limit, label=label, env_args=cfg.env_args, device=cfg.device, dtype=cfg.dtype,
                  cache=str(cache), **asdict(cfg.engine_options()), **options)
    summary = run(build_config(EvalConfig, values))[0]
    atomic_write(done, json.dumps(summary, indent=1) + "\n")
    return summary


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
            "samples": train[-1]["samples"] if train else 0, "seconds": sum(r.get("seconds", 0.0) for r in train)}


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


def logged_seconds(run: Run) -> float:
    """The training seconds ``run``'s log holds: before it resumes, what earlier invocations spent on
    its iterations (their start-up and held-out evaluations are not logged, so not counted)."""
    return sum(r.get("seconds", 0.0) for r in read_jsonl(run.path / "log.jsonl"))


def finish_run(cfg: StudyConfig, run: Run, argv: list[str], bar, cache: Path) -> dict[str, Any] | None:
    """Train, validate and measure one run (each step skipped when done before); its record
    (several processes: all train, process 0 measures and returns the record, the others None)."""
    dist = distributed.init()
    record_file = run.path / "study_record.json"
    if dist.from_main(record_file.is_file()):
        bar.update(1 + len(evaluations(cfg)))
        return json.loads(record_file.read_text()) if dist.is_main else None
    bar.set_postfix_str(f"{run.label} {run.setting} seed={run.seed}: training")
    earlier = logged_seconds(run)  # a run cut by an earlier invocation: its time counts too
    start = time.perf_counter()
    train_run(cfg, run, argv)
    bar.update(1)
    if not dist.is_main:
        dist.wait_for_main()  # while process 0 measures the run and writes its record
        return None
    record = {"method": run.method, "label": run.label, "setting": run.setting, "hparams": run.hparams,
              "seed": run.seed, "run": str(run.path), "validation": validation_result(run),
              "runtime": training_runtime(run), "engines": training_engines(run),
              "machines": training_machines(run), "shared_prefix": shared_prefix_of(run)}
    for name, options in evaluations(cfg):
        bar.set_postfix_str(f"{run.label} {run.setting} seed={run.seed}: eval {name}")
        record[name] = brief(measure(cfg, str(run.path), run.label, run.path / "eval" / name, options, cache))
        bar.update(1)
    record["wall_seconds"] = earlier + time.perf_counter() - start
    atomic_write(record_file, json.dumps(record, indent=1) + "\n")
    if cfg.commit:
        commit([record_file], f"study {run.path.parents[3].name}: {run.label} {run.setting} seed={run.seed} done")
    if not cfg.keep_weights:  # the numbers are on disk; a 7B model per run is not
        for sub in ("final", "checkpoints"):
            shutil.rmtree(run.path / sub, ignore_errors=True)
    dist.wait_for_main()
    return record


def brief(summary: dict[str, Any]) -> dict[str, Any]:
    """What the study keeps of a harness summary."""
    keys = ("env", "split", "method", "base_model", "hparams", "seed", "samples", "temperature", "max_new_tokens",
            "n", "responses", "pass@1", "pass@k", "correct_rate", "reward_mean", "reward_std", "parts_mean", "kl_mean",
            "kl_std", "kl_estimator", "errors", "device", "dtype", "engine", "machine", "file")
    return {k: summary.get(k) for k in keys}


# ----- aggregating ---------------------------------------------------------------------------------------


def select(cfg: StudyConfig, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, the setting with the best mean validation metric over seeds (ties: the other
    metric). Test numbers play no part."""
    other = "eval_reward" if cfg.metric == "eval_pass@1" else "eval_pass@1"
    chosen = {}
    for method in cfg.method_list:
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


# ----- the command ------------------------------------------------------------------------------------------


def resolve_engine(cfg: StudyConfig) -> None:
    """``--engine auto``: native for a model it runs, on CPU; hf otherwise (see ``AUTO_ENGINE``)."""
    if cfg.engine != AUTO_ENGINE:
        return
    from transformers import AutoConfig

    from trainers.common.models import ALIASES
    from trainers.engines.native.model import SUPPORTED

    if resolve_device(cfg.device).type != "cpu":
        cfg.engine = "hf"
        return
    try:
        model_type = "llama" if cfg.model.lower() in ALIASES else \
            AutoConfig.from_pretrained(cfg.model, local_files_only=True).model_type
    except (OSError, ValueError):
        model_type = None
    cfg.engine = "native" if model_type in SUPPORTED else "hf"


def study(cfg: StudyConfig) -> Path:
    dist = distributed.init()
    if dist.world > 1 and cfg.engine == "vllm":
        raise ConfigError(f"--engine vllm: the harness's measurements run on process 0 alone, and a vLLM engine "
                          f"started there joins all {dist.world} processes of this launch; use --engine native or "
                          f"hf with several processes, or run the study on one process")
    env = make_env(cfg.env, cfg.env_args, splits=("train",))  # bad options end here, before OUT exists
    try:
        env.examples(cfg.eval_split)
    except KeyError as exc:
        raise ConfigError(f"--eval-split: {exc.args[0]}") from None
    selected_on, validation = validation_plan(cfg, env)
    n_train = len(env.examples("train")) - (int(validation[1]) if validation[0] == "--val-size" else 0)
    prompts = prompts_per_step(cfg, n_train)
    for method in cfg.method_list:
        need = per_step(cfg, method, prompts)
        if cfg.max_samples < need:
            raise ConfigError(f"--max-samples {cfg.max_samples} is less than one {LABELS[method]} "
                              f"{'iteration' if method.startswith('es_') else 'step'} ({need} responses: "
                              f"{prompts} prompts x {need // prompts}); raise it or shrink the population/group")
    check_budgets(cfg, prompts)
    env.close()
    out = Path(dist.from_main(cfg.out or f"runs/study-{cfg.env}-{time.strftime('%Y%m%d-%H%M%S')}"))
    saved = out / "study.json"
    # process 0 reads it and every process gets its copy: another process must never read the file
    # while process 0 writes it below
    previous = dist.from_main(json.loads(saved.read_text()) if dist.is_main and saved.is_file() else None)
    settle_study_dtype(cfg, previous)
    identity = _identity(cfg)
    if previous is not None:
        if previous != identity:
            changed = sorted(k for k in previous.keys() | identity.keys() if previous.get(k) != identity.get(k))
            raise ConfigError(f"--out {out}: holds a study with other options ({', '.join(changed)}); "
                              f"use another --out, or the same options to resume it")
        check_device(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        atomic_write(saved, json.dumps(identity, indent=1) + "\n")
    runs = plan(cfg, out)
    argvs = [trainer_argv(cfg, run, prompts, validation) for run in runs]
    checked = set()
    for run, argv in zip(runs, argvs):  # each method's flags checked before the first run starts
        if run.method not in checked:
            trainer_of(run.method).resolve(argv)
            checked.add(run.method)

    start = time.perf_counter()
    units = len(runs) * (1 + len(evaluations(cfg))) + len(evaluations(cfg))
    bar = progress_bar(total=units, desc="study", unit="step", run=True, disable=not dist.is_main)
    base, cache = {}, out / "evals" / "cache"
    for name, options in evaluations(cfg):
        bar.set_postfix_str(f"base model: eval {name}")
        if dist.is_main:
            base[name] = brief(measure(cfg, cfg.model, ORIGINAL, out / "evals" / "base" / name, options, cache))
            if cfg.commit:
                commit([out / "study.json", out / "evals" / "base" / name / "summary.json"],
                       f"study {out.name}: the base model's {name} evaluation")
        bar.update(1)
    dist.wait_for_main()
    records = []
    for run, argv in zip(runs, argvs):
        dist.phase = f"the study's run {run.label} {run.setting} seed={run.seed}"
        record = finish_run(cfg, run, argv, bar, cache)
        if record is not None:
            record["hacked"] = hacked(record, base.get("kl"))
            records.append(record)
    bar.close()
    if not dist.is_main:
        return out
    chosen = select(cfg, records)
    write_report(cfg, out, records, base, chosen, selected_on, time.perf_counter() - start)
    if cfg.commit:
        commit([p for p in out.iterdir() if p.is_file()], f"study {out.name}: the report of {len(records)} runs")
    tqdm.write((out / "table1.md").read_text())
    tqdm.write(f"study written to {out} (table1.md, table2.md, runs.md, seed_variance.md, curves.png, pareto, results.json)")
    return out


def settle_study_dtype(cfg: StudyConfig, previous: dict[str, Any] | None) -> None:
    """``--dtype auto`` becomes a dtype, passed to every run and evaluation: a resumed study's own
    (``previous``, its study.json), else this machine's default. A study resumed with another dtype
    is refused (its identity differs), as one on another device is: one table must not mix their
    numerics."""
    if cfg.dtype not in (None, "auto"):
        return
    recorded = (previous or {}).get("dtype")
    if recorded in ("fp32", "bf16"):
        cfg.dtype = recorded
    else:
        try:
            cfg.dtype = dtype_name(default_dtype(resolve_device(cfg.device)))
        except ValueError as exc:
            raise ConfigError(f"--device: {exc}") from None


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


def _identity(cfg: StudyConfig) -> dict[str, Any]:
    """The options that define a study's runs (a resumed study must not mix others in); where the runs
    happen and how their memory is split (``INVOCATION``), and what the checks accept, are not among them."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("out", "keep_weights", "unequal_budgets", *INVOCATION)}


def main(argv: list[str] | None = None) -> Path:
    return run_main(functools.partial(parse_config, StudyConfig, description=__doc__.split("\n\n")[0]), study, argv)


if __name__ == "__main__":
    sys.argv[0] = "python -m benchmarks.study"
    main()
