"""LoRA adapters (``--lora-rank R``) for every trainer, engine and evaluation, through PEFT.

A trainer with ``--lora-rank R > 0`` wraps its base model with PEFT's LoRA (``get_peft_model``): every
targeted projection W computes ``W x + (alpha / R) * B A x``, where only A (R x d_in) and B
(d_out x R) are trained. PEFT owns the modules, their config and their files; this module holds
the choices made here:

- **Targets.** By default every attention and MLP projection (every ``nn.Linear`` / GPT-2 ``Conv1D``
  of the model except the output embedding); ``--lora-targets q_proj,v_proj`` names some. A name
  that matches no module is refused, naming the ones there are (``check_targets``, run on the
  model's config before a run directory exists).
- **How adapters start.** PEFT's default: B = 0, A random (Kaiming-uniform), drawn from a seed
  derived from the run seed, so a new adapter computes exactly the base model and the same seed
  draws the same A (an ES run rebuilds from its seeds; a resume without a checkpoint redraws it).
  RL's first gradient then reaches B (A's is 0 while B is); ES perturbs both factors, and noise on
  B changes the output at first order through the random A (``trainers/es/noise/adapters.py``).
- **Precision.** Adapter weights are fp32 whatever the base's dtype (PEFT's
  ``autocast_adapter_dtype``): they are their own master weights.
- **Where they go.** A run's ``final/`` (and every checkpoint) is a PEFT adapter directory,
  ``adapter_config.json`` + ``adapter_model.safetensors`` + the tokenizer, whose
  ``base_model_name_or_path`` is the run's ``--model``; ``load_model`` (every command's loader)
  loads such a directory as base + adapter, and ``python -m trainers.merge`` writes the merged
  full model.
- **The base model.** ``adapters_off(model)`` runs the base with the adapters disabled: the KL
  reference of RL and of ``python -m eval``, with no second copy of the weights.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: The file that makes a directory a PEFT adapter.
ADAPTER_CONFIG = "adapter_config.json"
#: Keeps the adapters' initial draw apart from every other use of the run seed.
INIT_STREAM = 0x10BA


class AdapterError(ValueError):
    """Adapter options that cannot apply to this model (commands report it in one line)."""


@dataclass
class LoraOptions:
    """The adapter flags every trainer has (``TrainConfig`` inherits them)."""

    lora_rank: int = field(default=0, metadata={"help": "train LoRA adapters of rank R instead of every weight "
                                                        "(0: off, every weight trains)"})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha: the adapter adds (alpha / R) B A "
                                                                     "(default: 2 R)"})
    lora_targets: str | None = field(default=None, metadata={"help": "comma-separated module names the adapters wrap, "
                                                                     "e.g. q_proj,v_proj (default: every attention "
                                                                     "and MLP projection)"})
    lora_dropout: float = field(default=0.0, metadata={"help": "dropout on the adapters' input while training (RL)"})

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    def check_lora(self) -> None:
        """One-line errors (``AdapterError``, naming the flag) for adapter options that are bad or
        contradict each other."""

        def check(condition: bool, name: str, message: str) -> None:
            if not condition:
                raise AdapterError(f"--{name.replace('_', '-')}: {message}")

        check(self.lora_rank >= 0, "lora_rank", f"must be >= 0 (0: no adapters), got {self.lora_rank}")
        if not self.lora:
            given = [f"--{n.replace('_', '-')}" for n, unset in (("lora_alpha", self.lora_alpha is None),
                                                                  ("lora_targets", self.lora_targets is None),
                                                                  ("lora_dropout", self.lora_dropout == 0.0))
                     if not unset]
            check(not given, "lora_rank", f"{', '.join(given)} given without adapters: add --lora-rank R (R >= 1)")
            return
        check(self.lora_alpha is None or self.lora_alpha > 0, "lora_alpha", "must be > 0")
        check(0 <= self.lora_dropout < 1, "lora_dropout", "must be in [0, 1)")
        check(self.lora_targets is None or bool(self.target_list), "lora_targets", "name at least one module")

    @property
    def target_list(self) -> list[str] | None:
        return None if self.lora_targets is None else [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    def adapter_alpha(self) -> float:
        return float(self.lora_alpha) if self.lora_alpha is not None else 2.0 * self.lora_rank


# ----- which modules -------------------------------------------------------------------------------


def projection_names(model: torch.nn.Module) -> list[str]:
    """The leaf names of the model's projections, in order of first appearance: every ``nn.Linear``
    and GPT-2 ``Conv1D`` except the output embedding (what adapters wrap by default)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names: list[str] = []
    for name, module in model.named_modules():
        if module is head or not (isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in names:
            names.append(leaf)
    return names


def resolve_targets(model: torch.nn.Module, opts: LoraOptions) -> list[str]:
    """The module names adapters wrap on ``model``; an ``AdapterError`` naming the available ones when a
    name of ``--lora-targets`` matches none."""
    available = projection_names(model)
    if not available:
        raise AdapterError(f"--lora-targets: this model ({type(model).__name__}) has no nn.Linear / Conv1D projection "
                           f"for adapters")
    targets = opts.target_list or available
    missing = [t for t in targets if t not in available]
    if missing:
        raise AdapterError(f"--lora-targets: {', '.join(missing)} matches no module of this model; its projections "
                           f"are {', '.join(available)}")
    return targets


def check_targets(config, opts: LoraOptions) -> None:
    """``resolve_targets`` on a weightless copy of the model ``config`` describes (meta device: no
    memory, no time), so that a typo ends before a run directory exists."""
    if not opts.lora:
        return
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    resolve_targets(skeleton, opts)


# ----- attaching, loading, saving ------------------------------------------------------------------


def lora_config(model: torch.nn.Module, opts: LoraOptions):
    from peft import LoraConfig

    return LoraConfig(r=opts.lora_rank, lora_alpha=opts.adapter_alpha(), lora_dropout=opts.lora_dropout,
                      target_modules=resolve_targets(model, opts), task_type="CAUSAL_LM",
                      fan_in_fan_out=type(model).__name__.startswith("GPT2"))


def base_name(name: str) -> str:
    """How an adapter records its base: a local path made absolute (the run directory loads from
    anywhere), an alias or hub id as given."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def attach(model: torch.nn.Module, opts: LoraOptions, seed: int, base: str):
    """``model`` wrapped with fresh adapters (PEFT's start: B = 0, A drawn from ``seed``), only the
    adapters trainable, the base recorded as ``base`` (``base_name``). Computes what ``model`` does."""
    import numpy as np
    from peft import get_peft_model

    config = lora_config(model, opts)
    draw = int(np.random.SeedSequence([seed, INIT_STREAM]).generate_state(1, np.uint32)[0])
    with torch.random.fork_rng(devices=[]):  # PEFT draws A on the CPU, before moving it to the layer's device
        torch.manual_seed(draw)
        peft_model = get_peft_model(model, config)
    peft_model.peft_config["default"].base_model_name_or_path = base_name(base)
    carry_compute_dtype(model, peft_model)
    return peft_model


def carry_compute_dtype(model, peft_model) -> None:
    """The compute dtype set on the wrapped model (``precision.set_compute_dtype``) holds for its wrapper."""
    from trainers.common.precision import _COMPUTE_ATTR

    if hasattr(model, _COMPUTE_ATTR):
        setattr(peft_model, _COMPUTE_ATTR, getattr(model, _COMPUTE_ATTR))


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a PEFT adapter directory (and not a full model)."""
    p = Path(path).expanduser()
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def adapter_base(path: str | os.PathLike) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``)."""
    try:
        base = json.loads((Path(path).expanduser() / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError) as exc:
        raise OSError(f"adapter {path}: cannot read {ADAPTER_CONFIG} ({exc})") from None
    if not base:
        raise OSError(f"adapter {path}: {ADAPTER_CONFIG} names no base_model_name_or_path")
    return str(base)


def load_adapter(base_model: torch.nn.Module, path: str | os.PathLike):
    """``PeftModel.from_pretrained(base_model, path)`` with its adapters trainable-ready (fp32)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base_model, str(path))
    carry_compute_dtype(base_model, model)
    return model


def has_adapters(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_parameters(model: torch.nn.Module, adapter: str = "default") -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of ``adapter``'s LoRA factors, in the model's order."""
    return [(n, p) for n, p in model.named_parameters() if ".lora_" in n and f".{adapter}." in n]


def train_adapters_only(model: torch.nn.Module, adapters: tuple[str, ...] = ("default",)) -> None:
    """Gradients for the LoRA factors of ``adapters`` and for nothing else."""
    trainable = {id(p) for a in adapters for _, p in adapter_parameters(model, a)}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)


@contextlib.contextmanager
def keep_requires_grad(model: torch.nn.Module) -> Iterator[None]:
    """PEFT's adapter switches also set ``requires_grad``; within the block they may, after it every
    parameter has its flag back (an RL step's graph needs them when it runs backward)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextlib.contextmanager
def adapters_off(model) -> Iterator[None]:
    """Within the block ``model`` (a PEFT model) computes its base model: the adapters disabled."""
    with keep_requires_grad(model), model.disable_adapter():
        yield


class BaseOf:
    """The base model of a PEFT model, as a model: calls run with the adapters disabled, everything
    else (config, parameters, embeddings, compute dtype) is the model's own. RL's KL reference and
    ``python -m eval``'s base for KL: the same weights, no second copy."""

    def __init__(self, model):
        self.peft_model = model

    def __call__(self, *args, **kwargs):
        with adapters_off(self.peft_model):
            return self.peft_model(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.peft_model, name)


@contextlib.contextmanager
def active_adapter(model, name: str) -> Iterator[None]:
    """Within the block ``model`` computes with its adapter ``name`` (PPO's critic adapter), then
    with the one it had."""
    before = model.active_adapter
    with keep_requires_grad(model):
        model.set_adapter(name)
        try:
            yield
        finally:
            model.set_adapter(before)


class WithAdapter:
    """``module``, a part of the PEFT model ``model`` (its transformer trunk), called with the
    adapter ``name`` active: PPO's critic on the policy's frozen base, with an adapter of its own.
    Other attributes are ``module``'s; the compute dtype is the model's."""

    def __init__(self, model, module: torch.nn.Module, name: str):
        self.peft_model, self.module, self.name = model, module, name

    def __call__(self, *args, **kwargs):
        with active_adapter(self.peft_model, self.name):
            return self.module(*args, **kwargs)

    def __getattr__(self, attr: str):
        from trainers.common.precision import _COMPUTE_ATTR

        return getattr(self.peft_model if attr == _COMPUTE_ATTR else self.module, attr)


def add_adapter(model, name: str, seed: int) -> None:
    """A second adapter ``name`` on the PEFT ``model``, configured as its first, drawn from ``seed``
    (PPO's critic); trainable, the active adapter unchanged."""
    import copy

    import numpy as np

    config = copy.deepcopy(model.peft_config["default"])
    draw = int(np.random.SeedSequence([seed, INIT_STREAM, 1]).generate_state(1, np.uint32)[0])
    with torch.random.fork_rng(devices=[]), keep_requires_grad(model):
        torch.manual_seed(draw)
        model.add_adapter(name, config)
    for _, p in adapter_parameters(model, name):
        p.requires_grad_(True)


def load_saved_adapters(model, path: str | os.PathLike) -> None:
    """Every other adapter saved with ``path`` (PEFT writes adapter NAME to ``path/NAME``: PPO's
    critic) loaded into ``model``, trainable."""
    for sub in sorted(Path(path).iterdir()):
        if (sub / ADAPTER_CONFIG).is_file() and sub.name not in model.peft_config:
            with keep_requires_grad(model):
                model.load_adapter(str(sub), adapter_name=sub.name, is_trainable=True)
            for _, p in adapter_parameters(model, sub.name):
                p.requires_grad_(True)


def merged(model):
    """The full model with the adapter added into its weights (PEFT's ``merge_and_unload``)."""
    return model.merge_and_unload()


def start_text(model) -> str:
    """'rank R on N modules (k of the model's parameters trainable)' for start lines."""
    config = model.peft_config["default"]
    modules = sum(1 for n, _ in model.named_modules() if n.endswith(".lora_A.default"))
    count = sum(p.numel() for _, p in adapter_parameters(model))
    total = sum(p.numel() for p in model.parameters())
    return (f"LoRA adapters rank {config.r}, alpha {config.lora_alpha:g} on {modules} modules "
            f"({', '.join(sorted(config.target_modules))}): {count / 1e6:.2f}M parameters, {count / total:.2%} of the model")
