"""The shared-prefix layout (``trainers.rl.logprobs.Grouped``) against one row per response
(``Padded``): the same log-probs, hidden states and gradients, on tiny Llama and Qwen2 models with
eager and SDPA attention, left-padded prompts of different lengths in one batch and responses of
different lengths in one group."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from conftest import build_tiny_model, build_tiny_qwen2
from trainers.common.models import set_compute_dtype
from trainers.rl.logprobs import (Grouped, Padded, batch_of, completion_states, group, has_groups, pad,
                                  selective_logprobs, token_logprobs)

#: Relative agreement asked of the two layouts in fp32 (the issue's bound).
TOLERANCE = 1e-5


def groups(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts of 9, 5 and 12 tokens with 3, 1 and 4 responses of 1 to 7 tokens."""
    gen = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=gen).tolist()  # noqa: E731
    prompts, completions = [], []
    for p, lengths in ((9, [7, 3, 5]), (5, [4]), (12, [1, 6, 7, 2])):
        prompt = ids(p)
        for n in lengths:
            prompts.append(prompt)
            completions.append(ids(n))
    return prompts, completions


def model_of(kind: str, attention: str, tokenizer):
    model = build_tiny_model(tokenizer) if kind == "llama" else build_tiny_qwen2(tokenizer)
    model.set_attn_implementation(attention)
    return model


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_same_logprobs_hidden_states_and_gradients(kind, attention, tiny_tokenizer):
    model = model_of(kind, attention, tiny_tokenizer).train()  # train mode: the update's own forward
    prompts, completions = groups(len(tiny_tokenizer))
    rows, grouped = pad(prompts, completions, 0), group(prompts, completions, 0)
    assert isinstance(grouped, Grouped) and grouped.prompt_ids.shape[0] == 3 and grouped.group.tolist() == [
        0, 0, 0, 1, 2, 2, 2, 2]
    weights = torch.randn(rows.mask.shape, generator=torch.Generator().manual_seed(1))
    results = {}
    for name, batch in (("rows", rows), ("grouped", grouped)):
        model.zero_grad(set_to_none=True)
        logp, states = token_logprobs(model, batch, temperature=0.7, hidden=True)
        ((logp * weights * batch.mask).sum() + (states.float().pow(2).mean(-1) * batch.mask).sum()).backward()
        results[name] = (logp.detach(), states.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (lp_a, st_a, g_a), (lp_b, st_b, g_b) = results["rows"], results["grouped"]
    m = rows.mask.bool()
    assert relative(lp_b[m], lp_a[m]) < TOLERANCE
    assert relative(st_b[m], st_a[m]) < TOLERANCE
    for name in g_a:
        assert relative(g_b[name], g_a[name]) < TOLERANCE, name


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_critic_trunk_states_are_the_same(kind, tiny_tokenizer):
    model = model_of(kind, "sdpa", tiny_tokenizer)
    prompts, completions = groups(len(tiny_tokenizer))
    rows, grouped = pad(prompts, completions, 0), group(prompts, completions, 0)
    with torch.no_grad():
        a, b = (completion_states(model.model, batch) for batch in (rows, grouped))
    assert relative(b[rows.mask.bool()], a[rows.mask.bool()]) < TOLERANCE


def test_bf16_compute_agrees_to_bf16_precision(tiny_tokenizer):
    """Under bf16 autocast (fp32 masters) the two layouts round differently, within bf16's precision."""
    model = copy.deepcopy(model_of("llama", "sdpa", tiny_tokenizer))
    set_compute_dtype(model, torch.bfloat16)
    prompts, completions = groups(len(tiny_tokenizer))
    with torch.no_grad():
        a = token_logprobs(model, pad(prompts, completions, 0))
        b = token_logprobs(model, group(prompts, completions, 0))
    m = pad(prompts, completions, 0).mask.bool()
    assert a.dtype == b.dtype == torch.float32
    assert (a[m] - b[m]).abs().max() < 0.05  # measured 0.015 nats; in fp32 they agree to 1e-7


def test_batch_of_groups_only_when_rows_share_a_prompt():
    assert has_groups([[1, 2], [1, 2], [3]]) and not has_groups([[1, 2], [3], [1, 2]])
    assert isinstance(batch_of([[1, 2], [1, 2]], [[5], [6]], 0), Grouped)
    assert isinstance(batch_of([[1, 2], [3]], [[5], [6]], 0), Padded)
    assert isinstance(batch_of([[1, 2], [1, 2]], [[5], [6]], 0, shared=False), Padded)


def test_selective_logprobs_is_log_softmax_and_its_gradient():
    logits = torch.randn(5, 3, 11, requires_grad=True)
    ids = torch.randint(0, 11, (5, 3))
    want = torch.log_softmax(logits / 0.5, -1).gather(-1, ids[..., None]).squeeze(-1)
    got = selective_logprobs(logits, ids, 0.5, rows=2)
    assert torch.allclose(got, want, atol=1e-6)
    (g_want,) = torch.autograd.grad(want.sum(), logits)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    assert torch.allclose(g_got, g_want, atol=1e-6)


def sliced_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float, rows: int) -> torch.Tensor:
    """``selective_logprobs`` as it was: a slice of ``logits`` per part (one backward node each)."""
    from torch.utils.checkpoint import checkpoint

    from trainers.rl.logprobs import _chosen_logprobs

    return torch.cat([checkpoint(_chosen_logprobs, logits[i:i + rows], ids[i:i + rows], temperature,
                                 use_reentrant=False) for i in range(0, logits.shape[0], rows)])


def backward_nodes(out: torch.Tensor) -> list[str]:
    """The names of every node of ``out``'s backward graph."""
    seen, todo, names = set(), [out.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return names


def test_selective_logprobs_takes_one_split_and_is_bit_identical_to_slicing():
    logits = torch.randn(9, 6, 50, requires_grad=True)
    ids = torch.randint(0, 50, (9, 6))
    got, want = selective_logprobs(logits, ids, 0.7, rows=2), sliced_logprobs(logits, ids, 0.7, rows=2)
    assert torch.equal(got, want)  # fp32: the same sums in the same order
    weights = torch.randn(9, 6)
    (g_got,) = torch.autograd.grad((got * weights).sum(), logits)
    (g_want,) = torch.autograd.grad((want * weights).sum(), logits)
    assert torch.equal(g_got, g_want)
    nodes = backward_nodes(selective_logprobs(logits, ids, 0.7, rows=2))
    assert nodes.count("SplitBackward0") == 1 and "SliceBackward0" not in nodes, nodes
    assert backward_nodes(sliced_logprobs(logits, ids, 0.7, rows=2)).count("SliceBackward0") == 5  # what it replaced


def test_a_model_that_ignores_logits_to_keep_gets_the_same_logprobs(tiny_tokenizer):
    """Its prompt pass returns every position's logits ([K, P, V]); only the last may score the first tokens."""
    model = model_of("llama", "sdpa", tiny_tokenizer)
    ignoring = copy.deepcopy(model)
    forward = ignoring.forward
    ignoring.forward = lambda *a, logits_to_keep=0, **k: forward(*a, **k)  # every position, whatever is asked
    prompts, completions = groups(len(tiny_tokenizer))
    batch = group(prompts, completions, 0)
    with torch.no_grad():
        assert ignoring(input_ids=batch.prompt_ids, logits_to_keep=1).logits.shape[1] == batch.prompt_ids.shape[1]
        want, got = token_logprobs(model, batch), token_logprobs(ignoring, batch)
    # the same positions' logits: equal up to the head's rounding, which differs between a product over one
    # position and one over all of them on some CPUs (4.8e-7 on a Zen 3; taking a wrong position is ~1)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def legacy_cache(trunk) -> None:
    """Make ``trunk`` return its cache as transformers < 4.56 did: lists of keys and values, no ``layers``."""
    from types import SimpleNamespace

    forward = trunk.forward

    def old_forward(*a, **k):
        out = forward(*a, **k)
        if out.past_key_values is not None:
            cache = out.past_key_values
            out.past_key_values = SimpleNamespace(key_cache=[layer.keys for layer in cache.layers],
                                                  value_cache=[layer.values for layer in cache.layers])
        return out

    trunk.forward = old_forward


def test_a_cache_without_layers_falls_back_to_one_row_per_response(tiny_tokenizer):
    """Where ``Cache.layers`` is missing (transformers < 4.56, a model's own cache) the grouped batch
    is computed one row per response: the padded layout's numbers and gradients, and a warning."""
    model = model_of("llama", "sdpa", tiny_tokenizer).train()
    old = copy.deepcopy(model)
    legacy_cache(old.model)  # the causal LM passes on its trunk's cache
    prompts, completions = groups(len(tiny_tokenizer))
    rows, grouped = pad(prompts, completions, 0), group(prompts, completions, 0)
    results = {}
    for name, net, batch in (("rows", model, rows), ("fallback", old, grouped)):
        with pytest.warns(UserWarning, match="computed on its own row") if net is old else contextlib.nullcontext():
            logp, states = token_logprobs(net, batch, temperature=0.7, hidden=True)
            critic = completion_states(net.model, batch)
        (logp * batch.mask).sum().backward()
        results[name] = logp.detach(), states.detach(), critic.detach(), [p.grad for p in net.parameters()]
    (lp_a, st_a, cr_a, g_a), (lp_b, st_b, cr_b, g_b) = results["rows"], results["fallback"]
    assert torch.equal(lp_a, lp_b) and torch.equal(st_a, st_b) and torch.equal(cr_a, cr_b)
    assert all(torch.equal(a, b) for a, b in zip(g_a, g_b))


def autograd_ops(*tensors: torch.Tensor) -> set[str]:
    """The names of the backward nodes in the graph behind ``tensors``."""
    todo, seen = [t.grad_fn for t in tensors], set()
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(child for child, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


@pytest.mark.parametrize("which", ["logprobs", "logprobs and hidden states", "critic states"])
def test_prompt_rows_are_copied_with_index_select_so_the_backward_repeats(which, tiny_tokenizer):
    """Indexing with a prompt's row repeated G times (``IndexBackward0``) adds the G gradients with
    parallel atomic adds on a CPU with several threads, in an order that changes from run to run
    (GRPO's weights differed after 2 steps); ``index_select``'s backward adds them in row order."""
    model = model_of("llama", "sdpa", tiny_tokenizer).train()
    batch = group(*groups(len(tiny_tokenizer)), 0)
    if which == "critic states":
        outputs = (completion_states(model.model, batch),)
    else:
        out = token_logprobs(model, batch, temperature=1.0, hidden=which != "logprobs")
        outputs = out if isinstance(out, tuple) else (out,)
    ops = autograd_ops(*outputs)
    assert "IndexSelectBackward0" in ops and "IndexBackward0" not in ops, sorted(ops)
