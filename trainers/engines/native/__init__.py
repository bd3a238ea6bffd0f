"""The native engine (``--engine native``): a decode loop made for population-batched ES, over the
model's own modules and weights, for the Llama family (Llama, SmolLM) and Qwen2.

One concern per file (sampling, shared with the hf engine, is ``trainers/engines/sampling.py``):

- ``cache.py``: the KV cache of a wave of rows, allocated once, written in place, compacted.
- ``model.py``: the decoder's forward pass (prefill and decode step) on that cache.
- ``rows.py``: low-rank members added per row, the factors of q/k/v and gate/up concatenated.
- ``engine.py``: the scheduler: waves of rows that fit in memory, one prefill, decode steps,
  finished rows leaving the batch.
- ``static.py``: the same at fixed shapes (CUDA's default): buffers kept across calls, batch-size
  buckets, finished rows masked, and each decode step replayed as a CUDA graph.
"""

from trainers.engines.native.engine import NativeEngine
from trainers.engines.native.model import SUPPORTED, unsupported

__all__ = ["NativeEngine", "SUPPORTED", "unsupported"]
