"""What a study is: its options (``StudyConfig``), the methods it compares, and the settling of
``auto`` options (engine, dtype) into the values every run and evaluation gets. A study's identity
(``identity``) is the options that define its runs; a resumed study must keep it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import llm_envs
from trainers.common.config import ConfigError, check, check_engine, check_tracking, env_kwargs
from trainers.common.models import DTYPE_CHOICES, resolve_device
from trainers.common.splits import MIN_VALIDATION
from trainers.engines import ENGINE_FIELDS, ENGINES, EngineOptions
from trainers.engines.options import ENGINES_HELP

METHODS = ("es_full", "es_lowrank", "es_sampled", "grpo", "dr_grpo", "ppo",
           "es_lora", "grpo_lora", "dr_grpo_lora", "ppo_lora")
#: The methods a study runs unless --methods names others (es_sampled is the optional one).
DEFAULT_METHODS = ("es_full", "es_lowrank", "grpo", "dr_grpo", "ppo")
#: How tables and plots name each method.
LABELS = {"es_full": "ES (full-rank)", "es_lowrank": "ES (low-rank)", "es_sampled": "ES (low-rank, sampled)",
          "grpo": "GRPO", "dr_grpo": "Dr.GRPO", "ppo": "PPO", "es_lora": "ES (LoRA)", "grpo_lora": "GRPO (LoRA)",
          "dr_grpo_lora": "Dr.GRPO (LoRA)", "ppo_lora": "PPO (LoRA)"}
#: The options of the adapter methods (``*_lora``): part of a study's identity only when it runs one.
LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_targets", "lora_sigmas", "lora_lrs")
#: The study's default engine: native where it runs (no start-up cost, and 1.2-5x HF on this CPU),
#: else hf; vLLM generates faster but takes ~20 s to start for each training run and evaluation.
AUTO_ENGINE = "auto"
#: Options that say how this invocation runs, not what the runs are: not part of a study's identity,
#: and passed again to an unfinished run when it resumes.
INVOCATION = ("device", "machine", "cpu_model", "grad_accum", "commit", "report_to",
              *(name for name in ENGINE_FIELDS if name != "engine"))


@dataclass
class StudyConfig(EngineOptions):
    engine: str = field(default=AUTO_ENGINE, metadata={
        "help": f"generation engine of every run and evaluation: auto (native for a Llama/Qwen2 model on CPU or "
                f"CUDA, hf otherwise), {ENGINES_HELP}", "choices": [AUTO_ENGINE, *ENGINES]})
    env: str = field(default="Conciseness-v0", metadata={"help": "environment id ('my_module:My-v0' imports my_module)"})
    seeds: int = field(default=4, metadata={"help": "seeds per method and setting (runs use seeds 0..K-1)"})
    max_samples: int = field(default=256, metadata={"help": "generated training responses per run, the same for "
                                                            "every method (no run exceeds it)"})
    model: str = field(default="smollm2-135m", metadata={"help": "base model: Hugging Face id, local directory, or smollm2-135m"})
    out: str | None = field(default=None, metadata={"help": "study directory (default runs/study-ENV-TIME); "
                                                            "running again with the same --out resumes"})
    methods: str = field(default=",".join(DEFAULT_METHODS), metadata={
        "help": f"comma-separated subset of {', '.join(METHODS)} (es_sampled: low-rank ES whose members are "
                f"measured on --es-samples sampled responses per prompt; *_lora: the method on LoRA adapters of "
                f"--lora-rank, ES with --lowrank-population members in one batched generation)"})
    sigmas: str = field(default="5e-4,1e-3", metadata={"help": "ES sigma grid, one setting each"})
    alpha_ratios: str = field(default="0.5", metadata={"help": "ES alpha = ratio x sigma, a grid (the paper's "
                                                                 "Conciseness: 0.5); with several, sigma x ratio"})
    population: int = field(default=8, metadata={"help": "N of full-rank ES"})
    lowrank_population: int = field(default=32, metadata={"help": "N of low-rank ES (one batched generation per iteration)"})
    rank: int = field(default=1, metadata={"help": "R of low-rank ES"})
    lora_rank: int = field(default=8, metadata={"help": "*_lora methods: the adapters' rank"})
    lora_alpha: float | None = field(default=None, metadata={"help": "*_lora methods: LoRA alpha (default: 2 x rank)"})
    lora_targets: str | None = field(default=None, metadata={"help": "*_lora methods: adapted modules (default: every "
                                                                     "attention and MLP projection)"})
    lora_sigmas: str | None = field(default=None, metadata={"help": "es_lora: sigma grid (default: --sigmas; adapter "
                                                                    "factors need larger ones than weights)"})
    lora_lrs: str | None = field(default=None, metadata={"help": "*_lora RL methods: learning-rate grid (default: "
                                                                 "--lrs; adapters take larger ones than full weights)"})
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
    curve_budgets: str | None = field(default=None, metadata={
        "help": "learning curves: continue each method's selected setting's grid runs, on every seed, to these "
                "budgets of training responses (comma-separated multiples of --max-samples, e.g. 1024,2048), "
                "measuring validation and test at each; the grid's runs keep what continuing needs until then"})
    extend_grids: int = field(default=0, metadata={
        "help": "rounds each method's step-size grid may be extended: where its selected setting sits at the "
                "grid's edge, one more step beyond that edge (by the edge's own factor) runs on every seed and the "
                "setting is selected again (0: never); a resumed study may raise it until its curves start"})
    rule_commit: str | None = field(default=None, metadata={
        "help": "the git commit that holds the study's pre-registered rule (benchmarks/study/verdicts.py), "
                "recorded in study.json and every run's record; it must be in this checkout's history"})
    min_val_prompts: int = field(default=20, metadata={"help": "refuse a validation split (the env's or carved) "
                                                               "with fewer distinct prompts than this: settings "
                                                               "selected on a handful of questions are noise"})
    eval_split: str = field(default="test", metadata={"help": "the split the study reports"})
    eval_limit: int | None = field(default=None, metadata={"help": "measure the first K examples of the validation and test splits"})
    kl_samples: int | None = field(default=None, metadata={"help": "sampled responses per test prompt for reward and KL "
                                                                   "(default: 20 for Conciseness-v0, else 1; 0: none)"})
    env_args: str | None = field(default=None, metadata={"help": "JSON object of environment options"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda (default: cuda if available)"})
    machine: str | None = field(default=None, metadata={
        "help": "pin the study to one machine, named as its run records name it (e.g. 'CPU AMD EPYC (bf16 units: "
                "none)'; benchmarks.study.status prints this machine's name): started on another, the study "
                "refuses before it runs anything, since a verdict must hold on each machine's runs alone "
                "(benchmarks.study.verdicts.per_machine) and a run here would be judged apart from the others"})
    cpu_model: str | None = field(default=None, metadata={
        "help": "pin the study also to the CPU's family and model numbers (e.g. 'family 26 model 2'; "
                "benchmarks.study.status prints this CPU's): two CPUs can share --machine's name (a Zen 4 and a "
                "Zen 5 are both 'CPU AMD EPYC (bf16 units: avx512_bf16)'), so a study that must run on one "
                "machine names its numbers too"})
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
    report_to: str | None = field(default=None, metadata={
        "help": "where every run's and measurement's metrics go (the trainers' --report-to; default: the trainers' "
                "tensorboard, measurements untracked); the study is their group, named as its directory"})

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
        check(self.lora_rank >= 1, "lora_rank", "must be >= 1 (the *_lora methods' adapters)")
        check(self.lora_alpha is None or self.lora_alpha > 0, "lora_alpha", "must be > 0")
        for name in ("lora_sigmas", "lora_lrs"):
            if getattr(self, name) is not None:
                check(all(v > 0 and math.isfinite(v) for v in self.grid(name)), name, "must be positive numbers")
        check(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        check(self.group_size >= 2, "group_size", "must be >= 2 (GRPO's advantages are relative to the group)")
        check(self.batch_size is None or self.batch_size >= 1, "batch_size", "must be >= 1")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        check(self.kl_samples is None or self.kl_samples >= 0, "kl_samples", "must be >= 0")
        check(self.eval_limit is None or self.eval_limit >= 1, "eval_limit", "must be >= 1")
        check(self.min_val_prompts >= 1, "min_val_prompts", "must be >= 1")
        check(self.extend_grids >= 0, "extend_grids", "must be >= 0")
        if self.curve_budgets:
            check(all(b > 0 and b == int(b) for b in self.grid("curve_budgets")), "curve_budgets",
                  "must be whole numbers of responses")
        env_kwargs(self.env_args)
        check_engine(self)
        if self.report_to is not None:
            check_tracking(self.report_to)
        if self.metric is None:
            self.metric = "eval_reward" if env_id == "Conciseness-v0" else "eval_pass@1"
        if self.kl_samples is None:
            self.kl_samples = 20 if env_id == "Conciseness-v0" else 1

    @property
    def method_list(self) -> list[str]:
        return [m.strip() for m in self.methods.split(",") if m.strip()]

    @property
    def uses_lora(self) -> bool:
        return any(m.endswith("_lora") for m in self.method_list)

    def grid(self, name: str) -> list[float]:
        if name in ("lora_sigmas", "lora_lrs") and getattr(self, name) is None:
            name = name.removeprefix("lora_")  # the full-weight methods' grid
        try:
            return [float(v) for v in getattr(self, name).split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--{name}: expected comma-separated numbers, got {getattr(self, name)!r}") from None



def settle_study_runtime(cfg: StudyConfig, previous: dict[str, Any] | None, dist) -> None:
    """``--dtype auto`` and ``--engine auto`` become the dtype and engine every run and evaluation
    gets (``trainers.common.runtime.resolve``, the trainers' own rule), decided on process 0 alone
    and handed to every process (``dist.from_main``): a resumed study keeps its own (``previous``, its
    study.json). A study resumed with another explicit dtype is refused (its identity differs), as one
    on another device is: one table must not mix their numerics."""
    from trainers.common import runtime

    try:
        device = resolve_device(cfg.device)
    except ValueError as exc:
        raise ConfigError(f"--device: {exc}") from None
    recorded = {k: (previous or {}).get(k) for k in ("dtype", "engine")}
    recorded = {k: v for k, v in recorded.items() if v and v not in ("auto", AUTO_ENGINE)}
    try:  # another explicit --dtype than the study's own is refused here, naming both
        resolved = runtime.resolve(cfg.model, device, cfg.dtype, cfg.engine, recorded, cfg.out, dist.from_main,
                                   dist.is_main)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg.dtype, cfg.engine = resolved.dtype, resolved.engine


def identity(cfg: StudyConfig) -> dict[str, Any]:
    """The options that define a study's runs (a resumed study must not mix others in); where the runs
    happen and how their memory is split (``INVOCATION``), and what the checks accept, are not among them."""
    # what the checks accept, and the curves that extend a finished grid, are not what the grid's runs are
    checks = ("unequal_budgets", "min_val_prompts", "curve_budgets")
    lora = () if cfg.uses_lora else LORA_OPTIONS  # a study without adapter methods keeps the identity it had
    return {k: v for k, v in asdict(cfg).items() if k not in ("out", "keep_weights", *checks, *INVOCATION, *lora)}


#: Options a resumed study may raise until its learning curves start: more rounds of grid extension
#: add runs beyond the grids' edges and change none that is done (the curves follow the selections).
MAY_RISE = ("extend_grids",)


def changed_options(previous: dict[str, Any], own: dict[str, Any], curves_started: bool = False) -> list[str]:
    """The options whose values differ between a study's saved identity and this invocation's; an
    option added after the study started (absent from ``previous``) counts only when set off its default,
    and one of ``MAY_RISE`` raised before the curves started does not count."""
    defaults = {f.name: f.default for f in fields(StudyConfig)}

    def raised(k: str) -> bool:
        return k in MAY_RISE and not curves_started and own.get(k, 0) >= previous.get(k, 0)

    return sorted(k for k in previous.keys() | own.keys() if previous.get(k) != own.get(k)
                  and not (k not in previous and own.get(k) == defaults.get(k)) and not raised(k))

