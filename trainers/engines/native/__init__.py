"""The native engine (``--engine native``): a decode loop made for population-batched ES, over the
model's own modules and weights, for the Llama family (Llama, SmolLM) and Qwen2.

One concern per file:

- ``cache.py``: the KV cache of a wave of rows, allocated once, written in place, compacted.
- ``model.py``: the decoder's forward pass (prefill and decode step) on that cache.
- ``rows.py``: low-rank members added per row, the factors of q/k/v and gate/up concatenated.
- ``sampler.py``: greedy or sampled next tokens, with Hugging Face's warpers.
- ``engine.py``: the scheduler: waves of rows that fit in memory, one prefill, decode steps,
  finished rows leaving the batch.
"""

from trainers.engines.native.engine import NativeEngine
from trainers.engines.native.model import SUPPORTED, unsupported

__all__ = ["NativeEngine", "SUPPORTED", "unsupported"]
