"""Per-token log-probabilities of completions under a model: what the RL losses train on, what
the reference and critic score, and what the eval harness's KL measures. Two layouts of a batch
give the same numbers (to rounding) and the same gradients:

``Padded``, one row per response (``--shared-prefix off``): a left-padded prompt followed by a
right-padded completion, so every completion starts at column ``P`` and the logits that score it
are the last ``T + 1`` positions of one forward pass (``logits_to_keep``)::

    [pad pad p0 p1 p2 | c0 c1 c2 pad]      position P-1+t predicts completion token t

``Grouped``, the responses to one prompt sharing it (the default whenever a batch has groups of two
or more: consecutive rows with the same prompt ids). Two forward passes instead of one:

1. the K distinct prompts, left-padded ``[K, P]``, with the key/value cache; their last position's
   logits predict every response's first token;
2. the B completions, each on its prompt's keys and values (the cache rows picked by
   ``index_select``, whose backward sums the G responses' gradients into the one prompt pass),
   positions continuing the prompt's; in ``LENGTH_BUCKETS`` calls of rows sorted by length, each
   padded only to its own longest.

A group of G responses then costs P + G T tokens of forward and backward instead of G (P + T): on
rg/ tasks (122 prompt tokens, <= 64 completion tokens, G = 8) 634 instead of 1,488. It runs on any
Hugging Face causal LM that takes ``past_key_values`` (its own attention: eager, SDPA, CUDA's),
but not under transformers' activation checkpointing, which drops the cache. A model whose cache
has no per-layer keys and values (``Cache.layers``, transformers >= 4.56; a model's own cache
class) gets the padded layout instead, with a warning: the same numbers, without the saving. A
model that ignores ``logits_to_keep`` has its prompt logits cut to the last position here.

The log-softmax is never materialised over the vocabulary for every position at once: the chosen
token's logit minus a logsumexp, a few rows at a time, recomputed in the backward pass
(``selective_logprobs``), so only the logits themselves are kept.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from trainers.common.models import compute_context

#: Rows of logits turned into log-probs at a time (SmolLM2: 4 x 64 x 49,152 fp32 = 50 MB).
LOGSOFTMAX_ROWS = 4
#: Pass 2's calls per batch: the completions sorted by length, in this many equal parts, each padded
#: to its own longest. A fixed count, so every process of an FSDP run makes as many forward passes.
LENGTH_BUCKETS = 2


@dataclass
class Padded:
    """Token tensors of a batch of (prompt, completion) pairs, one row each, in the layout above."""

    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    position_ids: torch.Tensor  # [B, P + T]
    completion_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float: 1 on completion tokens, 0 on padding
    prompt_width: int  # P

    @property
    def width(self) -> int:  # T
        return self.completion_ids.shape[1]


@dataclass
class Grouped:
    """A batch of whole groups: K distinct prompts, once each, and B completions, each naming its
    prompt (``group``)."""

    prompt_ids: torch.Tensor  # [K, P] left-padded
    prompt_mask: torch.Tensor  # [K, P]
    prompt_lengths: torch.Tensor  # [K]
    completion_ids: torch.Tensor  # [B, T] right-padded, T >= 2
    mask: torch.Tensor  # [B, T] float: 1 on completion tokens, 0 on padding
    group: torch.Tensor  # [B] long: the prompt row of each completion

    @property
    def width(self) -> int:  # T
        return self.completion_ids.shape[1]


def _right_padded(rows: Sequence[Sequence[int]], pad_id: int, min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(min_width, max(len(r) for r in rows))
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T))
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def pad(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
        device: torch.device | str = "cpu") -> Padded:
    """Left-pad the prompts and right-pad the completions into one batch."""
    P = max(len(p) for p in prompt_ids)
    completions, mask = _right_padded(completion_ids, pad_id)
    B, T = completions.shape
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + T), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        input_ids[i, P - len(p):P] = torch.tensor(list(p), dtype=torch.long)
        attention[i, P - len(p):P] = 1
    input_ids[:, P:] = completions
    attention[:, P:] = mask.long()
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Padded(input_ids.to(device), attention.to(device), position_ids.to(device), completions.to(device),
                  mask.to(device), P)


def group(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
          device: torch.device | str = "cpu") -> Grouped:
    """The batch with each run of consecutive rows that share their prompt ids as one group."""
    prompts: list[Sequence[int]] = []
    rows = []
    for p in prompt_ids:
        if not prompts or list(prompts[-1]) != list(p):
            prompts.append(p)
        rows.append(len(prompts) - 1)
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for k, p in enumerate(prompts):
        ids[k, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[k, P - len(p):] = 1
    # at least 2 columns: pass 2 always runs (under FSDP every process must run as many forward passes)
    completions, completion_mask = _right_padded(completion_ids, pad_id, min_width=2)
    return Grouped(ids.to(device), mask.to(device), mask.sum(-1).to(device), completions.to(device),
                   completion_mask.to(device), torch.tensor(rows, dtype=torch.long, device=device))


def has_groups(prompt_ids: Sequence[Sequence[int]]) -> bool:
    """Whether some consecutive rows share their prompt (the shared prefix then saves work)."""
    return any(list(a) == list(b) for a, b in zip(prompt_ids, prompt_ids[1:]))


def batch_of(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu", shared: bool | None = None) -> Padded | Grouped:
    """``group`` when ``shared`` (None: when some rows share a prompt), else ``pad``."""
    if shared is None:
        shared = has_groups(prompt_ids)
    return (group if shared else pad)(prompt_ids, completion_ids, pad_id, device)


# ----- log-probs ----------------------------------------------------------------------------------


def _chosen_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return x.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def selective_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                       rows: int = LOGSOFTMAX_ROWS) -> torch.Tensor:
    """``log softmax(logits / temperature)`` at ``ids``, fp32, ``[B, T]``: ``rows`` rows at a time;
    with gradients, each part is recomputed in the backward pass (only ``logits`` stays alive, not
    an fp32 copy, the tempered copy and the softmax of every position). The parts come from one
    ``split``, one backward node that writes each part's gradient into one tensor the size of
    ``logits``; slicing ``logits[i:i + rows]`` in a loop made one node per part, each zero-filling a
    gradient the size of the whole ``logits``."""
    grad = torch.is_grad_enabled() and logits.requires_grad
    parts = [checkpoint(_chosen_logprobs, x, i, temperature, use_reentrant=False) if grad
             else _chosen_logprobs(x, i, temperature) for x, i in zip(logits.split(rows), ids.split(rows))]
    return torch.cat(parts)


def token_logprobs(model, batch: Padded | Grouped, temperature: float = 1.0, hidden: bool = False):
    """Per-token log-probs ``[B, T]`` (fp32) of the completion tokens under ``model`` (at the sampling
    ``temperature``); with ``hidden=True`` also the last hidden states ``[B, T, H]`` at the positions
    that predict them (the states a value head reads). Pads hold garbage: always reduce with
    ``batch.mask``."""
    if isinstance(batch, Grouped):
        return _grouped_logprobs(model, batch, temperature, hidden)
    T, P = batch.width, batch.prompt_width
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                  use_cache=False, output_hidden_states=hidden)
    with compute_context(model):
        try:
            out = model(**inputs, logits_to_keep=T + 1)
        except TypeError:  # a model without logits_to_keep: all positions, sliced below
            out = model(**inputs)
    logp = selective_logprobs(out.logits[:, -(T + 1):-1, :], batch.completion_ids, temperature)
    if hidden:
        return logp, out.hidden_states[-1][:, P - 1:P + T - 1, :]
    return logp


def _prompt_pass(model, batch: Grouped, **kwargs):
    """Pass 1: the distinct prompts with their cache."""
    positions = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask, position_ids=positions, use_cache=True,
                 **kwargs)


def _last_logits(model, batch: Grouped, **kwargs):
    """Pass 1 and the logits of each prompt's last position, ``[K, 1, V]``: a model that ignores
    ``logits_to_keep`` (or does not take it) returns every position's, which would otherwise be
    broadcast against the completions' first tokens."""
    try:
        out = _prompt_pass(model, batch, logits_to_keep=1, **kwargs)
    except TypeError:  # a model without logits_to_keep
        out = _prompt_pass(model, batch, **kwargs)
    return out, out.logits[:, -1:]  # prompts are left-padded: the last column is every prompt's last token


def has_layers(cache) -> bool:
    """Whether ``cache`` holds per-layer keys and values the completions can be run on
    (``Cache.layers``, transformers >= 4.56; not a model's own cache class, nor a cache dropped by
    activation checkpointing)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(getattr(layer, "keys", None) is not None for layer in layers)


def as_padded(batch: Grouped) -> Padded:
    """The same responses one row each, each completion after its own prompt (the layout a model
    whose cache the shared prefix cannot use gets; the same numbers)."""
    attention = torch.cat([batch.prompt_mask[batch.group], batch.mask.long()], dim=1)
    return Padded(torch.cat([batch.prompt_ids[batch.group], batch.completion_ids], dim=1), attention,
                  (attention.cumsum(-1) - 1).clamp(min=0), batch.completion_ids, batch.mask, batch.prompt_ids.shape[1])


def _fall_back(cache) -> bool:
    """Whether the shared prefix cannot use ``cache`` (warned once per process)."""
    if has_layers(cache):
        return False
    warnings.warn(f"the shared prefix needs the model's key/value cache as transformers' Cache with per-layer keys "
                  f"and values (transformers >= 4.56); this model returned {type(cache).__name__}: each response is "
                  f"computed on its own row instead (the same numbers, without the saving)", stacklevel=3)
    return True


def _cache_rows(cache, rows: torch.Tensor):
    """A copy of the prompts' ``cache`` holding the rows ``rows`` of every layer (``index_select``:
    its backward adds each completion's gradient to its prompt's); ``cache`` itself is unchanged."""
    picked = copy.copy(cache)
    picked.layers = []
    for layer in cache.layers:
        own = copy.copy(layer)
        own.keys, own.values = per_response(layer.keys, rows), per_response(layer.values, rows)
        picked.layers.append(own)
    return picked


def buckets(batch: Grouped) -> list[torch.Tensor]:
    """The rows of pass 2's calls: sorted by completion length and cut into ``LENGTH_BUCKETS`` equal
    parts, each padded only to its own longest (completions that stop early cost less)."""
    order = torch.argsort(batch.mask.sum(1), stable=True)
    return list(torch.tensor_split(order, min(LENGTH_BUCKETS, len(order))))


def _completion_pass(model, batch: Grouped, cache, rows: torch.Tensor, **kwargs):
    """Pass 2 for the completions ``rows``, each on its prompt's keys and values; (output, width):
    the rows' completions are cut to ``width`` columns, their longest (at least 2)."""
    width = max(2, int(batch.mask[rows].sum(1).max()))
    groups = batch.group[rows]
    ids = batch.completion_ids[rows, :width - 1]  # the last token predicts nothing we score
    attention = torch.cat([batch.prompt_mask[groups], batch.mask[rows, :width - 1].long()], dim=1)
    positions = batch.prompt_lengths[groups, None] + torch.arange(width - 1, device=ids.device)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=_cache_rows(cache, groups),
                use_cache=True, **kwargs)
    return out, width


def per_response(prompt_rows: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Each response's copy of its prompt's row of ``prompt_rows`` (``[K, ...]`` -> ``[B, ...]``).
    ``index_select``, not ``prompt_rows[group]``: on CPU with several threads the backward of
    indexing with repeated indices adds the G copies' gradients with parallel atomic adds, in an
    order that changes from run to run (measured: GRPO's weights differed after 2 steps); that of
    ``index_select`` adds them in row order, so a run repeats bitwise."""
    return prompt_rows.index_select(0, group)


def _in_row_order(parts: list[torch.Tensor], rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """The bucket outputs ``parts`` (each ``[b, w, ...]``) padded to ``width`` columns and put back in
    the batch's row order."""
    padded = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1])) for p in parts]
    return torch.cat(padded).index_select(0, torch.argsort(torch.cat(rows)))


def _grouped_logprobs(model, batch: Grouped, temperature: float, hidden: bool):
    T, parts = batch.width, buckets(batch)
    with compute_context(model):
        prompts, last = _last_logits(model, batch, output_hidden_states=hidden)
        if _fall_back(prompts.past_key_values):
            return token_logprobs(model, as_padded(batch), temperature, hidden)
        first = selective_logprobs(per_response(last, batch.group), batch.completion_ids[:, :1], temperature)
        rest, states = [], []
        for rows in parts:
            out, width = _completion_pass(model, batch, prompts.past_key_values, rows, output_hidden_states=hidden)
            rest.append(selective_logprobs(out.logits, batch.completion_ids[rows, 1:width], temperature))
            if hidden:
                states.append(out.hidden_states[-1])
    logp = torch.cat([first, _in_row_order(rest, parts, T - 1)], dim=1)
    if not hidden:
        return logp
    first_states = per_response(prompts.hidden_states[-1][:, -1:], batch.group)
    return logp, torch.cat([first_states, _in_row_order(states, parts, T - 1)], dim=1)


def completion_states(trunk, batch: Padded | Grouped):
    """The last hidden states ``[B, T, H]`` of a transformer ``trunk`` (a model without LM head) at
    the positions that predict each completion token: the states a separate critic reads (the
    same positions as ``token_logprobs(..., hidden=True)``)."""
    with compute_context(trunk):
        if isinstance(batch, Grouped):
            prompts = _prompt_pass(trunk, batch)
            if _fall_back(prompts.past_key_values):
                return completion_states(trunk, as_padded(batch))
            parts = buckets(batch)
            rest = [_completion_pass(trunk, batch, prompts.past_key_values, rows)[0].last_hidden_state for rows in parts]
            first = per_response(prompts.last_hidden_state[:, -1:], batch.group)
            return torch.cat([first, _in_row_order(rest, parts, batch.width - 1)], dim=1)
        T, P = batch.width, batch.prompt_width
        out = trunk(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                    use_cache=False)
    return out.last_hidden_state[:, P - 1:P + T - 1, :]
