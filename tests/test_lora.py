"""LoRA adapters (``--lora-rank``) on a tiny random model: the adapters' start and their merge, ES on
adapters (exact restore, the population in one batched forward, resume after a kill), RL on
adapters (gradients reach the adapters only, the KL reference is the base, resume after a kill,
PPO's critic adapter), the engines, and what a run leaves (a PEFT adapter that PEFT loads, the
merge command, ``python -m eval`` with KL)."""

import copy
import json
from pathlib import Path

import pytest
import torch

from trainers.common import adapters
from trainers.common.adapters import LoraOptions
from trainers.common.models import load_model
from trainers.engines.hf import HFEngine
from trainers.engines.native import NativeEngine
from trainers.es.noise import fullrank
from trainers.es.noise.adapters import AdapterPopulation, params_of, select_layers
from trainers.es.noise.members import AdapterMembers, FullRankMember

pytestmark = pytest.mark.usefixtures("one_thread")

LETTER = "toy_envs:Letter-v0"  # reward = share of "a" characters in the completion (tests/toy_envs.py)
PROMPTS = ["Solve the puzzle.", "What is the capital of France?", "the answer is"]


def with_lora(model, rank: int = 4, seed: int = 0, trained: bool = False, **options):
    """A copy of ``model`` with fresh adapters; ``trained``: B drawn too, so the adapters change the output."""
    peft_model = adapters.attach(copy.deepcopy(model), LoraOptions(lora_rank=rank, **options), seed, "tiny")
    if trained:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            for _, p in adapters.adapter_parameters(peft_model):
                p.normal_(0, 0.3)
    return peft_model.eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def ids_of(tokenizer, n_rows: int = 1) -> torch.Tensor:
    row = tokenizer("Solve the puzzle. Give the answer", return_tensors="pt").input_ids
    return row.repeat(n_rows, 1)


# ----- the adapters themselves ---------------------------------------------------------------------


def test_fresh_adapters_give_the_base_models_logits(tiny_model, tiny_tokenizer):
    ids = ids_of(tiny_tokenizer)
    model = with_lora(tiny_model)
    assert len(select_layers(model)) == 2 * 7  # every attention and MLP projection of both layers
    assert torch.equal(logits(model, ids), logits(tiny_model, ids))  # B = 0: exactly the base
    assert any(p.abs().sum() > 0 for n, p in adapters.adapter_parameters(model) if "lora_A" in n)


def test_merged_model_gives_the_unmerged_logits(tiny_model, tiny_tokenizer):
    ids = ids_of(tiny_tokenizer)
    model = with_lora(tiny_model, trained=True)
    unmerged = logits(model, ids)
    assert not torch.allclose(unmerged, logits(tiny_model, ids), atol=1e-3)  # the adapters matter
    merged = adapters.merged(copy.deepcopy(model))
    assert not adapters.has_adapters(merged)
    torch.testing.assert_close(logits(merged, ids), unmerged, rtol=1e-4, atol=1e-4)


def test_the_same_seed_draws_the_same_start():
    from tests.conftest import build_tiny_model, build_tiny_tokenizer

    base = build_tiny_model(build_tiny_tokenizer())
    a, b, c = with_lora(base, seed=1), with_lora(base, seed=1), with_lora(base, seed=2)
    pa, pb, pc = (dict(adapters.adapter_parameters(m)) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


@pytest.mark.parametrize("argv, message", [
    (["--lora-alpha", "16"], "--lora-rank: --lora-alpha given without adapters: add --lora-rank R"),
    (["--lora-targets", "q_proj"], "--lora-rank: --lora-targets given without adapters"),
    (["--lora-rank", "-2", "--lora-alpha", "4"], "--lora-rank: must be >= 0"),
    (["--lora-rank", "4", "--lora-dropout", "1.5"], "--lora-dropout: must be in [0, 1)"),
    (["--lora-rank", "4", "--lora-targets", "q_proj,nope"], "--lora-targets: nope matches no module of this model; "
                                                            "its projections are q_proj, k_proj, v_proj, o_proj"),
    (["--lora-rank", "4", "--lora-targets", "lm_head", "--engine", "native"], "matches no module"),
    (["--lora-rank", "4", "--lora-targets", "embed_tokens"], "matches no module"),
])
@pytest.mark.parametrize("trainer", ["es", "grpo", "ppo"])
def test_bad_adapter_options_are_one_line(trainer, argv, message, tiny_model_dir, tmp_path, capsys):
    module = __import__({"es": "trainers.es.train"}.get(trainer, f"trainers.{trainer}"), fromlist=["main"])
    with pytest.raises(SystemExit):
        module.main(["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 or err[-1].startswith("error:"), err
    assert message in err[-1]
    assert not (tmp_path / "run").exists()  # refused before a run directory exists


@pytest.mark.parametrize("argv, message", [
    (["--lora-rank", "4", "--noise", "lowrank"], "--noise: lowrank does not apply with --lora-rank"),
    (["--lora-rank", "4", "--lora-dropout", "0.1"], "--lora-dropout: ES measures members without dropout"),
    (["--lora-rank", "4", "--param-filter", "q_proj"], "--param-filter: not with --lora-rank"),
])
def test_es_adapter_options_are_one_line(argv, message, tiny_model_dir, tmp_path, capsys):
    from trainers.es import train as es

    with pytest.raises(SystemExit):
        es.main(["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), *argv])
    assert message in capsys.readouterr().err


def test_native_refuses_targets_outside_its_projections():
    from trainers.engines.adapters import engine_refuses

    why = engine_refuses("native", LoraOptions(lora_rank=4, lora_targets="q_proj,c_fc"))
    assert "--engine native applies adapters to q_proj" in why and "c_fc" in why
    assert engine_refuses("native", LoraOptions(lora_rank=4, lora_targets="q_proj")) is None
    assert "ES on LoRA adapters" in engine_refuses("vllm", LoraOptions(lora_rank=4), es=True)


# ----- ES on adapters --------------------------------------------------------------------------------


def test_an_es_perturbation_is_restored_bit_for_bit(tiny_model, tiny_tokenizer):
    model = with_lora(tiny_model, trained=True)
    params = params_of(select_layers(model))
    before = [t.clone() for t in params.tensors]
    member = FullRankMember(params, seed=123, sigma=0.05, sign=-1.0)
    changed = False
    for _ in range(3):  # the paper's loop: perturb in place, restore
        with HFEngine.written_into_weights(member):
            changed |= any(not torch.equal(a, b) for a, b in zip(before, params.tensors))
        assert all(torch.equal(a, b) for a, b in zip(before, params.tensors))
    assert changed
    # the batched population never writes the weights, and leaves the model's own adapters on
    pop = AdapterPopulation.of_members(params, select_layers(model), [5, 6], [1.0, -1.0], 0.05)
    with pop.applied():
        logits(model, ids_of(tiny_tokenizer, 2))
    assert all(torch.equal(a, b) for a, b in zip(before, params.tensors))
    assert all(not layer.module.disable_adapters for layer in select_layers(model))


def per_member_logits(model, params, seeds, signs, sigma, ids):
    """Each member's logits from its own forward pass: its adapter written into the model."""
    out = []
    for seed, sign in zip(seeds, signs):
        with HFEngine.written_into_weights(FullRankMember(params, seed, sigma, sign)):
            out.append(logits(model, ids))
    return torch.cat(out)


@pytest.mark.parametrize("rank", [2, 8])  # the CPU's rank-1 sums and its bmm
def test_the_population_batched_forward_equals_separate_forwards(rank, tiny_model, tiny_tokenizer):
    model = with_lora(tiny_model, rank=rank, trained=True)
    layers = select_layers(model)
    params = params_of(layers)
    seeds, signs, sigma, rows = [11, 11, 12, 13], [1.0, -1.0, 1.0, 1.0], 0.1, 2
    ids = ids_of(tiny_tokenizer, rows)
    separate = per_member_logits(model, params, seeds, signs, sigma, ids)
    assert not torch.allclose(separate[:rows], separate[rows:2 * rows], atol=1e-3)  # members differ
    with AdapterPopulation.of_members(params, layers, seeds, signs, sigma).applied():
        batched = logits(model, ids.repeat(len(seeds), 1))
    torch.testing.assert_close(batched, separate, rtol=1e-4, atol=1e-4)


def test_the_population_is_batched_products_not_a_loop_over_members(tiny_model, tiny_tokenizer, monkeypatch):
    """Per layer, two bmm over all members at once (rank > 4 on CPU): as many calls for 8 members as for 2."""
    model = with_lora(tiny_model, rank=8, trained=True)
    layers = select_layers(model)
    params = params_of(layers)
    calls = {"n": 0}
    real = torch.bmm

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    counts = []
    for members in (2, 8):
        calls["n"] = 0
        pop = AdapterPopulation.of_members(params, layers, list(range(members)), [1.0] * members, 0.1)
        with pop.applied(), monkeypatch.context() as m:
            m.setattr(torch, "bmm", counting)
            logits(model, ids_of(tiny_tokenizer, members))
        counts.append(calls["n"])
    assert counts[0] == counts[1] == len(layers)  # one bmm (x A^T) per layer; the other is baddbmm_ in place


def test_first_perturbations_change_the_output(tiny_model, tiny_tokenizer):
    """PEFT's start (B = 0, A random): noise on B moves the output at first order from iteration 1."""
    model = with_lora(tiny_model)
    layers = select_layers(model)
    params = params_of(layers)
    ids = ids_of(tiny_tokenizer, 1)
    with AdapterPopulation.of_members(params, layers, [1, 1], [1.0, -1.0], 0.05).applied():
        out = logits(model, ids.repeat(2, 1))
    assert (out[0] - out[1]).abs().max() > 1e-3


@pytest.mark.parametrize("engine_cls", [HFEngine, NativeEngine])
def test_engines_generate_each_members_adapter_on_its_rows(engine_cls, tiny_model, tiny_tokenizer):
    """A population call gives each member the greedy text of that member alone (the adapter written
    into the PEFT model and generated with hf), and plain generation is the PEFT model's."""
    model = with_lora(tiny_model, trained=True)
    layers = select_layers(model)
    params = params_of(layers)
    seeds, signs, sigma = [3, 3, 4], [1.0, -1.0, 1.0], 0.2
    reference = HFEngine(model, tiny_tokenizer)
    alone = []
    for seed, sign in zip(seeds, signs):
        with HFEngine.written_into_weights(FullRankMember(params, seed, sigma, sign)):
            alone += reference.generate(PROMPTS, max_new_tokens=8, sort=False).token_ids
    engine = engine_cls(model, tiny_tokenizer)
    batched = engine.generate(PROMPTS * len(seeds), max_new_tokens=8, sort=False,
                              perturbation=AdapterMembers(params, layers, seeds, signs, sigma)).token_ids
    assert batched == alone
    assert len({tuple(t) for t in alone}) > len(PROMPTS)  # members answer differently
    plain = engine.generate(PROMPTS, max_new_tokens=8).token_ids
    assert plain == reference.generate(PROMPTS, max_new_tokens=8).token_ids
    base = HFEngine(tiny_model, tiny_tokenizer).generate(PROMPTS, max_new_tokens=8).token_ids
    assert plain != base  # the adapters are applied, not ignored
