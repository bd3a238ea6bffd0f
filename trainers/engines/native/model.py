"""The forward pass of a Llama-family decoder (Llama, SmolLM, Qwen2) over the model's own
modules and weights, with a preallocated KV cache and low-rank members added per row.

Nothing is copied or fused: every product reads the model's own weight tensors, so an ES update
or a full-rank member written into them in place is what the next call computes with, and the
engine costs no memory for weights. (Concatenating q/k/v and gate/up into single products was
measured on this CPU: no faster at 32 or 64 rows, and it would need a copy of the weights.) The
low-rank factors of the projections that share an input are concatenated instead (``rows.py``).

Norms, activation, the rotary formula and tables and the attention scaling come from the model's
own modules, so the numbers are those of Hugging Face ``generate`` up to the order of
floating-point sums (greedy completions equal HF's on every test, ``tests/test_native_engine.py``).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from trainers.engines.native.cache import KVCache
from trainers.engines.prompt_cache import distinct_rows

#: ``config.model_type`` values whose decoder this forward pass reproduces.
SUPPORTED = ("llama", "qwen2")

#: Up to this many token rows, a CPU product runs as ``W @ x^T``: at SmolLM2's shapes that was
#: 10-22% faster than ``F.linear`` (``x @ W^T``) for 8 to 64 rows and slower from 128 rows on.
TRANSPOSED_MAX_ROWS = 64


def linear(x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """``module``'s product (weight and bias) on ``x (..., d_in)``, in the faster layout for its size."""
    w, b = module.weight, module.bias
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or rows > TRANSPOSED_MAX_ROWS:
        return F.linear(x, w, b)
    y = torch.mm(w, x.reshape(rows, -1).T).T.contiguous()
    if b is not None:
        y = y + b
    return y.reshape(*x.shape[:-1], w.shape[0])


def unsupported(model) -> str | None:
    """Why ``--engine native`` cannot run ``model`` (one line naming the way out); None when it can."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", type(model).__name__)
    if kind not in SUPPORTED:
        return (f"--engine native runs Llama-family and Qwen2 models ({', '.join(SUPPORTED)}); this model is "
                f"{kind!r}: use --engine hf")
    windows = [t for t in (getattr(cfg, "layer_types", None) or []) if t != "full_attention"]
    if windows or getattr(cfg, "use_sliding_window", False):
        return "--engine native does not do sliding-window attention; use --engine hf"
    return None


def left_padded(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, valid)``, both ``(rows, width)``: the prompts left-padded to the longest, and which
    positions hold a real token (an empty row is all padding)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for s, r in enumerate(rows):
        if r:
            ids[s, width - len(r):] = torch.tensor(r)
            valid[s, width - len(r):] = True
    return ids.to(device), valid.to(device)


def prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """``(rows, 1, width, width)`` boolean: causal over real tokens; a pad token sees itself, so no
    row of the softmax is empty."""
    width = valid.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=valid.device)
    return ((causal & valid[:, None, :]) | eye)[:, None]


def prefill(decoder: "Decoder", ids: torch.Tensor, valid: torch.Tensor, rope, cache: KVCache,
            members: torch.Tensor | None, noise=None, keep: bool = False) -> torch.Tensor:
    """The prefill of every row of the left-padded prompts ``ids (rows, width)``, repeated prompts
    too, into ``cache``'s first ``rows`` slots: each row's last-token logits. ``noise``: a
    ``rows.RowNoise`` selected for ``members`` (``keep`` as in its ``select``)."""
    if noise is not None:
        noise.select(members, keep=keep)
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    return decoder.forward(ids, positions, rope, cache, 0, prefill_mask(valid), noise)


def shared_prefill(decoder: "Decoder", ids: torch.Tensor, valid: torch.Tensor, rope, cache: KVCache,
                   members: torch.Tensor | None, noise=None, keep: bool = False) -> torch.Tensor:
    """The prefill of the left-padded prompts ``ids (rows, width)`` into ``cache``'s first ``rows``
    slots, each distinct prompt (of one member) computed once: the responses of a group (an RL
    group, ``num_return_sequences``, pass@k) share their prompt's keys and values, copied to every
    row. Returns each row's last-token logits. ``noise``: a ``rows.RowNoise`` selected for
    ``members`` on return (``keep`` as in its ``select``)."""
    n = ids.shape[0]
    key = ids if members is None else torch.cat([ids, members[:, None]], 1)
    first, source = distinct_rows(key)  # the first row of each prompt, each row's prompt
    if len(first) == n:
        return prefill(decoder, ids, valid, rope, cache, members, noise, keep)
    logits = prefill(decoder, ids[first], valid[first], rope, cache, None if members is None else members[first],
                     noise, keep)
    cache.spread(source, ids.shape[1])
    if noise is not None:
        noise.select(members, keep=keep)
    return logits[source]


class Decoder:
    """``forward`` runs the decoder on T new tokens of each live row and returns the last token's
    logits; keys and values go into the ``KVCache`` at ``column``."""

    def __init__(self, model):
        self.model = model
        base = model.model
        self.embed, self.layers, self.norm = base.embed_tokens, list(base.layers), base.norm
        self.head = model.get_output_embeddings()
        attn = self.layers[0].self_attn
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.heads, self.kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
        self.rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb  # the model's own rotary formula
        self.rotary = base.rotary_emb
        self.vocab = self.head.weight.shape[0]

    def cache(self, slots: int, length: int) -> KVCache:
        w = self.head.weight
        return KVCache(len(self.layers), slots, self.kv_heads, length, self.head_dim, self._dtype(), w.device)

    def _dtype(self) -> torch.dtype:
        """The dtype the layers compute in: autocast's (fp32 master weights, RL), else the weights'."""
        kind = self.head.weight.device.type
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.head.weight.dtype

    def rope(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions ``0 .. length - 1``, ``(length, head_dim)``: computed once per wave,
        indexed by each row's positions at every step."""
        w = self.head.weight
        positions = torch.arange(length, device=w.device)[None]
        cos, sin = self.rotary(torch.empty(0, device=w.device, dtype=self._dtype()), positions)
        return cos[0], sin[0]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, rope, cache: KVCache, column: int | torch.Tensor,
                mask: torch.Tensor, noise=None) -> torch.Tensor:
        """Logits ``(rows, vocab)`` (fp32) of the last of the T tokens ``ids (rows, T)``.

        ``positions (rows, T)``: rotary positions; ``mask``: which cached columns each token may
        see, ``(rows, 1, T, column + T)`` boolean for a prefill, ``(rows, 1, 1, columns)``
        additive (0 or -inf) for a decode step: ``column + 1`` columns, or (a fixed-shape step,
        ``column`` a one-element tensor) a fixed count whose unwritten columns are -inf. The
        attention reads the cache's first ``mask.shape[-1]`` columns. ``noise``: a ``rows.RowNoise`` or None."""
        cos, sin = rope[0][positions], rope[1][positions]  # (rows, T, head_dim)
        x = self.embed(ids)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer.self_attn, layer.input_layernorm(x), cos, sin, cache, column, mask, noise)
            x = x + self._mlp(i, layer.mlp, layer.post_attention_layernorm(x), noise)
        return linear(self.norm(x[:, -1]), self.head).float()

    def _attention(self, i, attn, h, cos, sin, cache, column, mask, noise) -> torch.Tensor:
        rows, t, _ = h.shape
        q, k, v = (linear(h, p) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        if noise is not None:
            noise.add(i, "qkv", h, (q, k, v))
        q = q.view(rows, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(rows, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(rows, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotate(q, k, cos, sin)
        cache.write(i, column, k, v)
        keys, values = cache.read(i, rows, mask.shape[-1])
        if t == 1:  # decode: the query heads of each kv head as one product, no repeated K/V
            group = self.heads // self.kv_heads
            qg = q.reshape(rows, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(qg, keys.transpose(-1, -2)) * self.scaling + mask
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(weights, values).reshape(rows, 1, self.heads * self.head_dim)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling,
                                                 enable_gqa=self.heads != self.kv_heads)
            out = out.transpose(1, 2).reshape(rows, t, self.heads * self.head_dim)
        o = linear(out, attn.o_proj)
        if noise is not None:
            noise.add(i, "o", out, (o,))
        return o

    def _mlp(self, i, mlp, h, noise) -> torch.Tensor:
        gate, up = linear(h, mlp.gate_proj), linear(h, mlp.up_proj)
        if noise is not None:
            noise.add(i, "gate_up", h, (gate, up))
        a = mlp.act_fn(gate) * up
        down = linear(a, mlp.down_proj)
        if noise is not None:
            noise.add(i, "down", a, (down,))
        return down
