"""The plan of a study: every run (method x setting x seed), what one step of each method costs
within the sample budget, where settings are selected (the validation split), the trainer flags
of each run, and the measurements every model gets."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.study.config import INVOCATION, LABELS, StudyConfig
from trainers.common.config import ConfigError
from trainers.common.splits import MIN_VALIDATION, VALIDATION, WithValidation, measured_split_counts
from trainers.common.base_eval import FILE as BASE_EVAL  # under OUT/evals/, not committed
from trainers.engines import ENGINE_FIELDS

@dataclass
class Run:
    method: str
    setting: str  # e.g. "sigma=0.001" or "beta=0_lr=1e-05"
    hparams: dict[str, float]
    seed: int
    path: Path
    #: For a setting added beyond the grid's edge (``--extend-grids``): its round, the edge ("top" or
    #: "bottom") and the setting selected before it; None for the grid's own settings.
    extension: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return LABELS[self.method]


def setting_name(method: str, hparams: dict[str, float], alpha_in_name: bool = True) -> str:
    """A setting's name from its hyperparameters: ES "sigma=S" (or "sigma=S_alpha=A" where the grid
    varies alpha), RL "beta=B_lr=L"."""
    if method.startswith("es_"):
        return f"sigma={hparams['sigma']:g}" + (f"_alpha={hparams['alpha']:g}" if alpha_in_name else "")
    return f"beta={hparams['beta']:g}_lr={hparams['lr']:g}"


def settings(cfg: StudyConfig, method: str) -> list[tuple[str, dict[str, float]]]:
    """The grid points of ``method``: (name, hyperparameters)."""
    lora = method.endswith("_lora")
    if method.startswith("es_"):
        ratios, sigmas = cfg.grid("alpha_ratios"), cfg.grid("lora_sigmas" if lora else "sigmas")
        points = [{"sigma": s, "alpha": r * s} for s in sigmas for r in ratios]
        return [(setting_name(method, hp, len(ratios) > 1), hp) for hp in points]
    lrs = cfg.grid("lora_lrs" if lora else "lrs")
    points = [{"beta": b, "lr": lr} for b in cfg.grid("betas") for lr in lrs]
    return [(setting_name(method, hp), hp) for hp in points]


def plan(cfg: StudyConfig, out: Path) -> list[Run]:
    """Every run of the grid, method by method (each method's settings, each on every seed): a method's
    setting is selected, its grid extended and its other settings' checkpoints released before the
    next method starts, so a study with learning curves keeps one method's checkpoints at a time."""
    return [Run(m, name, hp, seed, out / "runs" / m / name / f"seed={seed}")
            for m in cfg.method_list for name, hp in settings(cfg, m) for seed in range(cfg.seeds)]


STEP = {"es": "alpha", "rl": "lr"}  # the step size of each family: the axis a grid is extended along


def extension(cfg: StudyConfig, out: Path, method: str, records: list[dict[str, Any]], selected: str) -> list[Run]:
    """The runs (every seed) of one step beyond the edge of ``method``'s step-size grid where its
    ``selected`` setting sits, by the factor between the edge and its neighbour (``--extend-grids``:
    at most that many rounds per method); none where the selection is inside the grid, the grid has
    a single step size, or the rounds are used up."""
    mine = [r for r in records if r["method"] == method]
    rounds = max((r["extension"]["round"] for r in mine if r.get("extension")), default=0)
    if rounds >= cfg.extend_grids:
        return []
    step = STEP["es" if method.startswith("es_") else "rl"]
    chosen = next(r["hparams"] for r in mine if r["setting"] == selected)
    others = {k: v for k, v in chosen.items() if k != step}
    line = sorted({r["hparams"][step] for r in mine if {k: v for k, v in r["hparams"].items() if k != step} == others})
    if len(line) < 2 or chosen[step] not in (line[0], line[-1]):
        return []
    top = chosen[step] == line[-1]
    beyond = line[-1] * line[-1] / line[-2] if top else line[0] * line[0] / line[1]
    hp = {**chosen, step: beyond}
    name = setting_name(method, hp, not method.startswith("es_") or len(cfg.grid("alpha_ratios")) > 1)
    info = {"round": rounds + 1, "edge": "top" if top else "bottom", "selected": selected}
    return [Run(method, name, hp, seed, out / "runs" / method / name / f"seed={seed}", info) for seed in range(cfg.seeds)]


def per_step(cfg: StudyConfig, method: str, prompts: int) -> int:
    """Responses one iteration (ES) or one sampled batch (RL) of ``method`` generates."""
    if method == "es_full":
        return cfg.population * prompts
    if method in ("es_lowrank", "es_lora"):
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


def split_plan(cfg: StudyConfig, env, selected_on: str, validation: list[str]) -> dict[str, dict[str, int]]:
    """Examples and distinct prompts of the split each run trains on, the one settings are selected on
    and the reported one (as measured: the first ``--eval-limit``); a validation split with fewer
    than ``--min-val-prompts`` distinct prompts is refused."""
    if "--val-size" in validation:
        env = WithValidation(env, int(validation[validation.index("--val-size") + 1]))
    counts = measured_split_counts(env, ("train", selected_on, cfg.eval_split), cfg.eval_limit)
    if selected_on == VALIDATION and counts[VALIDATION]["prompts"] < cfg.min_val_prompts:
        c = counts[VALIDATION]
        raise ConfigError(f"--min-val-prompts {cfg.min_val_prompts}: the validation split holds {c['prompts']} distinct "
                          f"prompts ({c['examples']} examples); settings selected on so few are noise: raise "
                          f"--val-size, or lower --min-val-prompts")
    return counts


def trainer_argv(cfg: StudyConfig, run: Run, prompts: int, validation: list[str], budget: int | None = None,
                 checkpoint_every: int | None = None) -> list[str]:
    """The trainer flags of ``run``: ``budget`` training responses (default ``--max-samples``), a
    checkpoint every ``checkpoint_every`` steps (default: ES at its end, RL every quarter). Every run
    takes the paper's preset where the study sets nothing (``--preset paper``: the size is the
    study's), and with ``--report-to`` belongs to the study's tracking group. The runs share their
    validation before training (``--base-eval``: made once for the runs whose weights and
    evaluation settings are the same: every method's, from one base model on one engine)."""
    budget = budget or cfg.max_samples
    argv = ["--env", cfg.env, "--model", cfg.model, "--seed", str(run.seed), "--out", str(run.path),
            "--max-samples", str(budget), "--batch-size", str(prompts), "--eval-every", "0", *validation,
            "--preset", "paper", "--base-eval", str(run.path.parents[3] / "evals" / BASE_EVAL)]
    if cfg.report_to is not None:
        argv += ["--report-to", cfg.report_to, "--report-group", study_group(run)]
    for name in ("max_new_tokens", "eval_limit", "env_args", "device", "dtype", *ENGINE_FIELDS):
        if getattr(cfg, name) is not None:
            argv += [f"--{name.replace('_', '-')}", str(getattr(cfg, name))]
    steps = budget // per_step(cfg, run.method, prompts)
    hp = {k: repr(v) for k, v in run.hparams.items()}
    if run.method.endswith("_lora"):  # the method on adapters: --lora-rank and its companions
        argv += ["--lora-rank", str(cfg.lora_rank)]
        argv += ["--lora-alpha", repr(cfg.lora_alpha)] if cfg.lora_alpha is not None else []
        argv += ["--lora-targets", cfg.lora_targets] if cfg.lora_targets is not None else []
    if run.method.startswith("es_"):
        lowrank = run.method in ("es_lowrank", "es_sampled")
        batched = lowrank or run.method == "es_lora"  # the whole population in one generation
        every = checkpoint_every or max(1, steps)  # resume replays the seeds
        argv += ["--iterations", str(steps), "--checkpoint-every", str(every),
                 "--population", str(cfg.lowrank_population if batched else cfg.population),
                 "--sigma", hp["sigma"], "--alpha", hp["alpha"], "--mirrored", str(cfg.mirrored),
                 "--noise", "lowrank" if lowrank else "full"]
        argv += ["--rank", str(cfg.rank)] if lowrank or run.method == "es_full" else []
        if run.method == "es_sampled":
            argv += ["--temperature", repr(cfg.es_temperature), "--samples-per-prompt", str(cfg.es_samples)]
    else:
        argv += ["--steps", str(steps), "--checkpoint-every", str(checkpoint_every or quarter(steps)), "--group-size",
                 str(cfg.group_size), "--beta", hp["beta"], "--lr", hp["lr"], "--grad-accum", str(cfg.grad_accum)]
        argv += ["--loss", "dr_grpo"] if run.method.removesuffix("_lora") == "dr_grpo" else []
    return argv


def quarter(steps: int) -> int:
    """An RL run's checkpoint interval: about a quarter of its steps, dividing them, so its last step
    is checkpointed (a learning curve continues the run from there)."""
    every = max(1, steps // 4)
    while steps % every:
        every -= 1
    return every


def study_group(run: Run) -> str:
    """The tracking group of a study's runs and measurements: the study directory's name."""
    return run.path.parents[3].name  # OUT/runs/METHOD/SETTING/seed=S


def trainer_of(method: str):
    """The trainer module (its ``resolve`` and ``train``) that runs ``method``."""
    import importlib

    name = {"es_full": "es.train", "es_lowrank": "es.train", "es_sampled": "es.train", "grpo": "rl.grpo",
            "dr_grpo": "rl.grpo", "ppo": "rl.ppo", "es": "es.train"}[method.removesuffix("_lora")]
    return importlib.import_module(f"trainers.{name}")



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



def evaluations(cfg: StudyConfig) -> list[tuple[str, dict[str, Any]]]:
    """(name, eval options) of the measurements every model gets on the test split."""
    greedy = {"samples": 1, "temperature": 0.0}
    out = [("greedy", greedy)]
    if cfg.kl_samples:
        out.append(("kl", {"samples": cfg.kl_samples, "temperature": 1.0, "kl_to": "base"}))
    return out

