"""The KV cache of one wave of rows: allocated once for the whole call (prompt + every new
token), written in place, and compacted when rows finish.

Layout ``(layers, slots, kv_heads, length, head_dim)``: the live rows are always slots
``0 .. live - 1``, so one slice gives every layer's keys for a batched product, and a finished
row leaves by having a live row from the end moved into its slot (only the moved rows are copied).
The fixed-shape path (``static.py``) keeps one cache across calls and writes each decode step's
column through a tensor (``column``), so a captured CUDA graph replays the same kernels every step.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, layers: int, slots: int, kv_heads: int, length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (layers, slots, kv_heads, length, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, column: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the keys and values ``(rows, kv_heads, T, head_dim)`` of the first ``rows`` slots
        at columns ``column .. column + T - 1`` (``column``: an int, or a one-element long tensor
        holding it, T = 1: no host value, as a CUDA graph needs)."""
        rows, _, t, _ = k.shape
        if isinstance(column, torch.Tensor):
            self.k[layer, :rows].index_copy_(2, column, k)
            self.v[layer, :rows].index_copy_(2, column, v)
            return
        self.k[layer, :rows, :, column:column + t] = k
        self.v[layer, :rows, :, column:column + t] = v

    def read(self, layer: int, rows: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first ``rows`` slots, columns ``0 .. end - 1`` (views)."""
        return self.k[layer, :rows, :, :end], self.v[layer, :rows, :, :end]

    def spread(self, source: torch.Tensor, end: int) -> None:
        """Slot ``s`` (of ``0 .. len(source) - 1``) takes slot ``source[s]``'s columns ``0 .. end - 1``:
        the prompt that rows share, computed once, copied to each of them. One layer at a time, so
        the gather's temporary is a layer's, not the whole cache's."""
        rows = len(source)
        for layer in range(self.k.shape[0]):
            self.k[layer, :rows, :, :end] = self.k[layer, source, :, :end]
            self.v[layer, :rows, :, :end] = self.v[layer, source, :, :end]

    def move(self, dst: torch.Tensor, src: torch.Tensor, end: int) -> None:
        """Slots ``src`` into slots ``dst`` (columns ``0 .. end - 1``), every layer at once."""
        self.k[:, dst, :, :end] = self.k[:, src, :, :end]
        self.v[:, dst, :, :end] = self.v[:, src, :, :end]
