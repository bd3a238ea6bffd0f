"""Trainer configs: a dataclass is the single source of flags, YAML keys and defaults.

Every field becomes a ``--flag-name`` (help from ``field(metadata={"help": ...})``); ``--config
FILE.yaml`` supplies values that flags on the command line override. Bad values end the program
with a one-line message naming the flag, never a traceback. ``TrainConfig`` holds the options
every trainer shares; ``ESConfig`` and ``RLConfig`` add their own.

A config built from a command line remembers where each value it was given came from
(``given(config)``: a flag or the ``--config`` file), so a preset fills only the others
(``trainers/common/sizing.py``) and config.yaml records which values came from where (a resumed run
keeps its record, and adds the flags given at ``--resume``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
import yaml

import llm_envs
from trainers.common import adapters, distributed, precision, runtime
from trainers.common.adapters import AdapterError, LoraOptions
from trainers.common.cli import Parser  # noqa: F401  (every command's parser; imported from here too)
from trainers.common.precision import DTYPE_CHOICES
from trainers.common.run_dir import RunDirError, recorded_runtime
from trainers.common.runtime import Runtime
from trainers.common.tracking import GROUP_HELP, REPORT_TO_HELP, TrackingError, check_report_to
from trainers.engines.options import EngineOptions, EngineUnavailable
from trainers.es.noise.lowrank import LayerError

C = TypeVar("C")

#: Keys of config.yaml that are not options: each is derived from the options and written by the
#: run (``algorithm``; ``sources``: where each value came from), and ignored when a config is read
#: back as options (``--config``, ``--resume``).
DERIVED_KEYS = ("algorithm", "sources")
#: Where a value of a config came from, in config.yaml's ``sources``.
FROM_FLAG, FROM_FILE = "flag", "--config file"


class ConfigError(ValueError):
    """A bad hyperparameter or config file (the message names it)."""


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(type, optional) of an annotation like ``float | None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and len(args) < len(typing.get_args(annotation)):
        return args[0], True
    return annotation, False


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _convert(name: str, value: Any, annotation: Any) -> Any:
    kind, optional = _base_type(annotation)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{_flag(name)}: a value is required")
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{_flag(name)}: expected {kind.__name__}, got {value!r}") from None


def make_parser(cls: type, description: str = "") -> argparse.ArgumentParser:
    """A parser with ``--config`` and one flag per field of ``cls``. Flags that are not given are
    absent from the parsed namespace (``default=SUPPRESS``): what the namespace holds is exactly
    what the command line said. Abbreviations (``--iter`` for ``--iterations``) are refused. A field's
    ``metadata["aliases"]`` adds short flags (``python -m eval -n 20 -r 4``)."""
    hints = typing.get_type_hints(cls)
    parser = Parser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    parser.add_argument("--config", help="YAML file of field: value pairs (flags given here override it)")
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind, _ = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        meta = f.metadata.get("help", "")
        choices = f.metadata.get("choices")
        parser.add_argument(*f.metadata.get("aliases", ()), _flag(f.name), dest=f.name, default=argparse.SUPPRESS,
                            choices=choices,
                            metavar=kind.__name__.upper() if not choices else None,
                            help=f"{meta} (default: {default})".replace("%", "%%"))  # argparse formats help with %
    return parser


def parse_config(cls: type[C], argv: list[str] | None = None, description: str = "") -> C:
    """Build ``cls`` from ``--config`` YAML and command-line flags; exits with a message on error."""
    parser = make_parser(cls, description)
    flags = vars(parser.parse_args(argv))
    config_file = flags.pop("config", None)
    try:
        file = load_yaml(config_file) if config_file else {}
        return build_config(cls, file | flags, _sources(file, FROM_FILE) | _sources(flags, FROM_FLAG))
    except ConfigError as exc:
        parser.error(str(exc))


def _sources(values: dict[str, Any], origin: str) -> dict[str, str]:
    return {k: origin for k in values if k not in DERIVED_KEYS}


def given(config: Any) -> dict[str, str]:
    """Option -> where its value came from, for the options a config was given (``build_config``'s
    ``sources``). A config built in code (no record) counts every option that differs from its
    default as given."""
    recorded = getattr(config, "_sources", None)
    if recorded is not None:
        return recorded
    return {f.name: "code" for f in dataclasses.fields(config)
            if f.init and f.default is not dataclasses.MISSING and getattr(config, f.name) != f.default}


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config: no such file {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: invalid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of field: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build_config(cls: type[C], values: dict[str, Any], sources: dict[str, str] | None = None) -> C:
    """``cls(**values)`` with types converted, unknown keys rejected and ``validate()`` run;
    ``sources``: where each given value came from (default: "code"), kept for ``given``."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {k: v for k, v in values.items() if k not in DERIVED_KEYS}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(_flag(u) for u in unknown)}")
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        if f.name in values and choices and values[f.name] is not None and values[f.name] not in choices:
            raise ConfigError(f"{_flag(f.name)}: {values[f.name]!r} is not one of {', '.join(choices)}")
    config = cls(**{k: _convert(k, v, hints[k]) for k, v in values.items()})
    config._sources = {k: "code" for k in values} if sources is None else {k: v for k, v in sources.items() if k in names}
    if hasattr(config, "validate"):
        config.validate()
    return config


def check(condition: bool, name: str, message: str) -> None:
    """Raise ``ConfigError`` naming ``--name`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"{_flag(name)}: {message}")


def check_engine(options: EngineOptions) -> None:
    """``options.check_engine_options()``, its error a ``ConfigError`` (options.py is a leaf module)."""
    try:
        options.check_engine_options()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def env_kwargs(env_args: str | None) -> dict[str, Any]:
    """The environment options of ``--env-args`` (a JSON object), or ``{}``."""
    if env_args is None:
        return {}
    try:
        args = json.loads(env_args)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-args: invalid JSON ({exc})") from None
    check(isinstance(args, dict), "env_args", "must be a JSON object")
    return args


def make_env(env_id: str, env_args: str | dict[str, Any] | None = None, splits: tuple[str, ...] = (),
             **extra: Any) -> llm_envs.TaskEnv:
    """Build ``env_id`` with the options of ``--env-args`` (a JSON string or a dict) and ``extra``,
    and its ``splits`` (options some environments check only then). An option the environment
    rejects (an unknown name, a bad value) is a ``ConfigError`` naming ``--env-args``; a bad data
    file stays a ``DataError`` (its message names the file). Call it before creating any run
    directory, so that a typo costs nothing."""
    options = env_kwargs(env_args) if not isinstance(env_args, dict) else env_args
    try:
        env = llm_envs.make(env_id, **options, **extra)
        for split in splits:
            try:
                env.examples(split)
            except KeyError as exc:  # a split the env does not have
                raise ConfigError(f"--split: {exc.args[0]}") from None
        return env
    except llm_envs.UnknownEnvError as exc:
        raise ConfigError(f"--env: {exc}") from None
    except (llm_envs.DataError, ConfigError):
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--env-args {json.dumps(options)}: {exc}") from None


@dataclass
class TrainConfig(EngineOptions, LoraOptions):
    """The options every trainer has (ES, GRPO, PPO): the generation engine, what to train on,
    where the run lives, the held-out evaluation, checkpoints, the sample budget and LoRA adapters
    (``LoraOptions``: ``--lora-rank`` and its companions). Trainers add their own fields, and each
    sets ``algorithm``."""

    #: What config.yaml records as ``algorithm:`` (es / grpo / dr_grpo / ppo), the key tables and
    #: plots label a run by. Each trainer's config fixes it (from ``--loss`` for GRPO): no flag
    #: can set it to a wrong value, and it is not read back.
    algorithm: ClassVar[str | None] = None

    env: str = field(default="Countdown-v0", metadata={"help": "environment id; 'my_module:My-v0' imports my_module first"})
    model: str = field(default="smollm2-135m", metadata={"help": "Hugging Face id, local directory, or smollm2-135m"})
    seed: int = field(default=0, metadata={"help": "run seed: batches, noise and sampling derive from it"})
    out: str | None = field(default=None, metadata={"help": "run directory (default runs/METHOD-ENV-TIME)"})
    resume: str | None = field(default=None, metadata={"help": "continue the run in this directory from its latest checkpoint"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "generation budget (default: the env's)"})
    gen_batch_size: int = field(default=32, metadata={"help": "sequences per generate() call"})
    eval_every: int = field(default=10, metadata={"help": "held-out pass@1 every K iterations (0: only start and end)"})
    eval_split: str = field(default="test", metadata={"help": "split for held-out evaluation"})
    eval_limit: int | None = field(default=None, metadata={"help": "evaluate on the first K held-out examples only"})
    base_eval: str | None = field(default=None, metadata={
        "help": "JSON file runs from one base model share: the held-out evaluation before training is read from it "
                "where a run made it with the same weights, settings, code and machine, else made and added "
                "(trainers.sweep and studies pass one)"})
    checkpoint_every: int = field(default=50, metadata={"help": "save a checkpoint every K iterations"})
    max_samples: int | None = field(default=None, metadata={"help": "sample budget: generated training responses a run never exceeds "
                                                                   "(an iteration or step starts only if it fits)"})
    env_args: str | None = field(default=None, metadata={"help": "JSON object of environment options, e.g. '{\"train_size\": 50}'"})
    val_size: int | None = field(default=None, metadata={"help": "move K training examples (a fixed choice) into a "
                                                                 "'validation' split and train on the rest; "
                                                                 "--eval-split validation evaluates there"})
    val_carve: str = field(default="question", metadata={
        "help": "what --val-size keeps together: question = examples with the same prompt and answer (a "
                "hidden-state env's examples share a prompt); prompt = the prompt text alone (runs before this "
                "option; a resumed run without it keeps it)", "choices": ["question", "prompt"]})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda (default: cuda if available)"})
    dtype: str | None = field(default="auto", metadata={
        "help": "compute dtype: auto (bf16 on a CUDA GPU that supports it; on CPU whichever a ~2 s probe of the "
                "model's layer shapes measured faster, cached, fp32 unless bf16 wins by 15%), fp32 or bf16; bf16 keeps "
                "fp32 master weights (a resumed run keeps its first dtype: another is refused)",
        "choices": DTYPE_CHOICES})
    score_workers: int | None = field(default=None, metadata={"help": "scoring processes (0: in this process, for pure-Python scorers)"})
    preset: str = field(default="auto", metadata={
        "help": "the run's size where no flag or --config value says: paper (the paper's hyperparameters), cpu (a "
                "documented size whose iteration takes minutes on a 2-core CPU), or auto: paper, unless a short probe "
                "on this device says its iteration would take over ~2 h, then cpu (docs/es.md#sized-to-the-machine)",
        "choices": ["auto", "paper", "cpu"]})
    report_to: str = field(default="tensorboard", metadata={"help": REPORT_TO_HELP})
    report_group: str | None = field(default=None, metadata={"help": GROUP_HELP})

    def validate(self) -> None:
        check_tracking(self.report_to)
        try:
            llm_envs.registry.resolve_id(self.env)
        except llm_envs.UnknownEnvError as exc:
            raise ConfigError(f"--env: {exc}") from None
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        check(self.gen_batch_size is None or self.gen_batch_size >= 1, "gen_batch_size", "must be >= 1")
        check(self.max_samples is None or self.max_samples >= 1, "max_samples", "must be >= 1")
        check(self.val_size is None or self.val_size >= 1, "val_size", "must be >= 1")
        check(self.base_eval is None or not Path(self.base_eval).is_dir(), "base_eval", "is a directory: name a JSON file")
        if self.dtype is None:  # config.yaml of runs recorded before --dtype auto
            self.dtype = "auto"
        check(self.dtype in DTYPE_CHOICES, "dtype", f"{self.dtype!r} is not one of {', '.join(DTYPE_CHOICES)}")
        check(self.eval_every >= 0 and self.checkpoint_every >= 1, "eval_every", "eval_every >= 0, checkpoint_every >= 1")
        env_kwargs(self.env_args)  # validates: a JSON object or nothing
        check_engine(self)
        try:
            self.check_lora()
        except AdapterError as exc:
            raise ConfigError(str(exc)) from None


def check_tracking(report_to: str | None) -> None:
    """``--report-to``: known backends whose packages are installed, else a ``ConfigError`` naming the extra."""
    try:
        check_report_to(report_to)
    except TrackingError as exc:
        raise ConfigError(str(exc)) from None


def settle_runtime(cfg: TrainConfig, device: torch.device, broadcast=None, is_main: bool = True) -> Runtime:
    """The run's runtime (``runtime.resolve``: the model's config, the compute dtype and the engine,
    each with its reason), rank 0's on every rank (``broadcast``), with ``cfg.dtype`` written back as
    ``fp32``/``bf16`` so config.yaml records what ran. A resumed run keeps the dtype and the ``auto``
    engine it recorded at its first start; another explicit ``--dtype`` is a ``ConfigError``, raised
    before anything is written."""
    recorded = recorded_runtime(cfg.resume)
    try:
        resolved = runtime.resolve(cfg.model, device, cfg.dtype, cfg.engine, recorded, cfg.resume, broadcast, is_main)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg.dtype = resolved.dtype
    if cfg.lora and not cfg.resume:  # a --lora-targets typo, or adapters an engine cannot run, end here
        check_adapters(cfg, resolved.engine)
    return resolved


def check_adapters(cfg: LoraOptions, engine: str) -> None:
    """``--lora-targets`` against the model's modules (its config alone), and the adapters against
    ``engine``: one ``ConfigError`` line naming what to change."""
    from trainers.common.models import model_config
    from trainers.engines.adapters import engine_refuses

    try:
        config = model_config(cfg.model)
        adapters.check_targets(config, cfg)
    except AdapterError as exc:
        raise ConfigError(str(exc)) from None
    why = engine_refuses(engine, cfg, es=getattr(cfg, "algorithm", None) == "es")
    if why:
        raise ConfigError(why)


def to_dict(config: Any) -> dict[str, Any]:
    """What config.yaml holds: ``algorithm`` (when the config has one), then every option, then
    ``sources``: where each value not left at its default came from."""
    algorithm = getattr(config, "algorithm", None)
    sources = {k: v for k, v in given(config).items() if k not in ("resume", "out")}
    return ({"algorithm": algorithm} if algorithm else {}) | dataclasses.asdict(config) | (
        {"sources": sources} if sources else {})


#: The errors a command reports in one line (bad options, run directories, data files, models
#: that cannot load, an engine that cannot run here), never as a traceback.
USER_ERRORS = (ConfigError, RunDirError, llm_envs.DataError, OSError, EngineUnavailable, LayerError,
               precision.PrecisionError, AdapterError)


def fail(message: str) -> typing.NoReturn:
    """End a command-line program with a clear message (exit code 2, like argparse)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def resolve_config(cls: type, prefix, argv: list[str] | None = None, description: str = ""):
    """The config of a new run (``--config`` YAML, then flags), or of a resumed run: its saved
    config.yaml, with the flags given on this command line (and only those) overriding it.
    ``prefix`` (a string, or a function of the config) names the default run directory."""
    parser = make_parser(cls, description)
    flags = vars(parser.parse_args(argv))
    config_file = flags.pop("config", None)
    try:
        if not flags.get("resume"):
            file = load_yaml(config_file) if config_file else {}
            cfg = build_config(cls, file | flags, _sources(file, FROM_FILE) | _sources(flags, FROM_FLAG))
            if cfg.out is None:
                name = prefix(cfg) if callable(prefix) else prefix
                cfg.out = f"runs/{name}-{cfg.env}-{time.strftime('%Y%m%d-%H%M%S')}"
            return cfg
        resume = flags["resume"]
        if config_file:
            raise ConfigError("--config: not with --resume (the run's config.yaml is used; override options with flags)")
        saved_file = Path(resume) / "config.yaml"
        if not saved_file.is_file():
            raise ConfigError(f"--resume {resume}: no run there (config.yaml missing)")
        saved = load_yaml(saved_file)
        if saved.get("val_size") and "val_carve" not in saved:  # carved before the rule was recorded: by prompt
            saved["val_carve"] = "prompt"
        # the run's own record of where its values came from, and this command line's flags
        sources = (saved.get("sources") or {}) | _sources(flags, f"{FROM_FLAG} (at --resume)")
        return build_config(cls, saved | flags | {"resume": resume, "out": resume}, sources)
    except ConfigError as exc:
        parser.error(str(exc))


def run_main(resolve, train, argv: list[str] | None = None):
    """``train(resolve(argv))``, returned, with bad configs, run directories and data as one-line
    errors; on several processes a lost process, the launcher's SIGTERM and diverged weights too
    (``distributed.one_line_errors``)."""
    with distributed.one_line_errors():
        try:
            return train(resolve(argv))
        except USER_ERRORS as exc:
            fail(str(exc))
