"""A group's prompt computed once for Hugging Face ``generate`` (the hf engine's share of what the
native engine's ``model.shared_prefill`` does).

An RL step samples G responses to each prompt, so a batch holds each prompt G times, and
``generate`` computes every row's prompt: G identical prompt passes. Here each distinct row of a
batch (its left-padded ids) runs through the model once, but for its last token, and the keys and
values are copied to the rows that share it; ``generate`` then continues from that cache, which is
how Transformers reuses a prompt's cache ("prefix caching"): it computes only each row's last prompt
token, at the positions it would have given it.

Only where the rows see the same weights: a per-row perturbation (ES's low-rank or adapter
population, hooks that give each row its own member) makes equal prompts differ, so the hf engine
asks for this only without one.
"""

from __future__ import annotations

import inspect

import torch


def distinct_rows(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ``key (rows, width)`` (left-padded prompts, with a member column where
    members differ): the first row of each, and the distinct row each row is. The native engine's
    ``shared_prefill`` and the hf engine's ``shared_prompt_cache`` both find a group's rows so."""
    n = key.shape[0]
    _, source = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((int(source.max()) + 1,), n, device=key.device).scatter_reduce_(
        0, source, torch.arange(n, device=key.device), "amin")
    return first, source


def _base(model):
    """The model a PEFT wrapper holds, or ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def can_share_prompts(model) -> bool:
    """Whether ``model`` (or the model a PEFT wrapper holds) can continue ``generate`` from a cache
    built here: a decoder whose default cache is a plain ``DynamicCache`` of attention layers
    (not a state-space or linear-attention cache, which cannot be copied row by row this way), and
    whose forward takes ``position_ids`` and ``logits_to_keep`` (so the shared pass keeps the
    logits of one position, not the vocabulary at every prompt token)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    base = _base(model)
    config = getattr(base, "config", None)
    supports = getattr(type(base), "_supports_default_dynamic_cache", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or supports is None or not supports():
        return False
    takes = inspect.signature(base.forward).parameters
    if "position_ids" not in takes or "logits_to_keep" not in takes:
        return False
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache cannot read: generate builds its own, and shares nothing
        return False
    return all(isinstance(layer, DynamicLayer) for layer in layers)


def shared_prompt_cache(model, input_ids: torch.Tensor, attention: torch.Tensor):
    """A ``DynamicCache`` holding every row's prompt but its last token, each distinct row computed
    once (``input_ids`` left-padded, ``attention`` its mask), for ``model.generate`` to continue
    from with the same ``input_ids`` and ``attention``. None where the rows are all distinct, where
    a prompt is a single token or empty, or where ``can_share_prompts`` is False: ``generate``
    then computes every row's prompt itself."""
    from transformers import DynamicCache

    first, source = distinct_rows(input_ids)
    if len(first) == len(source) or input_ids.shape[1] < 2 or not bool(attention[:, -1].all()):
        return None
    if not can_share_prompts(model):
        return None
    ids, mask = input_ids[first, :-1], attention[first, :-1]
    # generate's own positions for a left-padded batch (GenerationMixin._prepare_position_ids_for_generation)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=_base(model).config)
    model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
          logits_to_keep=1)
    cache.batch_select_indices(source)
    return cache
