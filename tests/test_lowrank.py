"""Low-rank population noise: the batched forward pass equals each member evaluated alone with its
E added to the weights explicitly (logits, KV-cached greedy and sampled generation, several
architectures, fp32 and bf16), the update equals its formula, and bad ranks are one-line errors."""

import copy
import math

import numpy as np
import pytest
import torch

from llm_envs import BatchScorer, Example, Score, chat
from toy_envs import LetterEnv
from trainers.engines.generation import generate
from trainers.engines.hf import HFEngine
from trainers.es.noise import fullrank, lowrank

SEEDS, SIGNS = [11, 11, 12, 13], [1.0, -1.0, 1.0, -1.0]  # a mirrored pair and two single members
SIGMA = 0.05  # large, so that members' greedy texts differ on a tiny random model


def explicit_member(model, seed: int, sign: float, rank: int, dtype=torch.float32):
    """A copy of ``model`` with sign * sigma * E(seed) added to every perturbed weight (in fp32)."""
    member = copy.deepcopy(model).to(torch.float32)
    with torch.no_grad():
        for i, layer in enumerate(lowrank.select_layers(member, None, rank)):
            layer.weight.add_(sign * SIGMA * lowrank.explicit_perturbation(layer, i, seed, rank))
    return member.to(dtype)


def member_major(rows: torch.Tensor, members: int) -> torch.Tensor:
    return rows.repeat(members, 1)


def tiny_qwen2(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.1)
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # Qwen2 has q/k/v biases: make them non-zero so they are exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def tiny_gpt2(vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab, n_embd=48, n_layer=2, n_head=4, n_positions=256, initializer_range=0.1)
    torch.manual_seed(2)
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("rank", [1, 3, 8])  # 1 and 3: broadcast products on CPU; 8: bmm
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_batched_logits_equal_explicit_members(arch, rank, tiny_model, tiny_tokenizer):
    model = {"llama": lambda: tiny_model, "qwen2": lambda: tiny_qwen2(len(tiny_tokenizer)),
             "gpt2": lambda: tiny_gpt2(len(tiny_tokenizer))}[arch]()
    layers = lowrank.select_layers(model, None, rank)
    assert layers and all("embed" not in l.name and "lm_head" not in l.name and "wte" not in l.name for l in layers)
    if arch == "gpt2":
        assert all(l.transposed for l in layers)  # Conv1D
    prompts = torch.randint(5, len(tiny_tokenizer), (2, 9), generator=torch.Generator().manual_seed(0))
    before = [l.weight.clone() for l in layers]
    pop = lowrank.Population(layers, SEEDS, SIGNS, SIGMA, rank)
    with torch.no_grad(), pop.applied():
        batched = model(member_major(prompts, len(SEEDS))).logits
    assert all(torch.equal(l.weight, b) for l, b in zip(layers, before)), "evaluation must not touch the weights"
    with torch.no_grad():
        base = model(prompts).logits
        for n, (seed, sign) in enumerate(zip(SEEDS, SIGNS)):
            alone = explicit_member(model, seed, sign, rank)(prompts).logits
            assert (alone - base).abs().max() > 0.1, "the perturbation must matter, or the test proves nothing"
            assert torch.allclose(batched[2 * n:2 * n + 2], alone, atol=1e-5, rtol=0), (arch, n)


def test_greedy_and_sampled_generation_with_kv_cache_equal_members_alone(tiny_model, tiny_tokenizer):
    """Every member gets, in one batched generate call (KV cache on), the completions it gets alone;
    sampling at a vanishing temperature goes through the sampling path and must give the same."""
    prompts = [chat("Say 3."), chat("What is the capital of France?")]
    rows = [p for _ in SEEDS for p in prompts]  # member-major
    layers = lowrank.select_layers(tiny_model, None, 2)
    pop = lowrank.Population(layers, SEEDS, SIGNS, SIGMA, 2)
    with pop.applied():
        greedy = generate(tiny_model, tiny_tokenizer, rows, max_new_tokens=12, batch_size=len(rows), sort=False)
        sampled = generate(tiny_model, tiny_tokenizer, rows, max_new_tokens=12, batch_size=len(rows), sort=False,
                           temperature=1e-7, seed=0)
    assert sampled.token_ids == greedy.token_ids
    alone = []
    for seed, sign in zip(SEEDS, SIGNS):
        member = explicit_member(tiny_model, seed, sign, 2)
        alone += generate(member, tiny_tokenizer, prompts, max_new_tokens=12).token_ids
    assert greedy.token_ids == alone
    assert len({tuple(ids) for ids in alone}) > 2, "members must generate different texts"


@pytest.mark.parametrize("rank", [1, 8])
def test_out_of_place_hook_equals_in_place(rank, tiny_model, tiny_tokenizer):
    """With gradients on (a module output that requires grad) the hook adds out of place; the
    logits are those of the in-place path."""
    layers = lowrank.select_layers(tiny_model, None, rank)
    prompts = member_major(torch.randint(5, len(tiny_tokenizer), (2, 9), generator=torch.Generator().manual_seed(4)),
                           len(SEEDS))
    pop = lowrank.Population(layers, SEEDS, SIGNS, SIGMA, rank)
    with pop.applied():
        with torch.no_grad():
            in_place = tiny_model(prompts).logits
        with torch.enable_grad():
            out_of_place = tiny_model(prompts).logits
    assert out_of_place.requires_grad
    assert torch.allclose(in_place, out_of_place.detach(), atol=1e-5, rtol=0)  # fused vs separate rounding


def test_bf16_batched_close_to_explicit(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    layers = lowrank.select_layers(model, None, 1)
    prompts = torch.randint(5, len(tiny_tokenizer), (2, 9), generator=torch.Generator().manual_seed(3))
    pop = lowrank.Population(layers, SEEDS, SIGNS, SIGMA, 1)
    assert all(t.dtype == torch.float32 for t in pop.B + pop.At)  # the update's own factors
    with torch.no_grad(), pop.applied():
        batched = model(member_major(prompts, len(SEEDS))).logits.float()
    with torch.no_grad():
        base = model(prompts).logits.float()
        for n, (seed, sign) in enumerate(zip(SEEDS, SIGNS)):
            alone = explicit_member(model, seed, sign, 1, torch.bfloat16)(prompts).logits.float()
            effect = (alone - base).abs().max()
            assert (batched[2 * n:2 * n + 2] - alone).abs().max() < 0.1 * effect


@pytest.mark.parametrize("rank", [1, 8])  # the CPU's rank-1 sums and the batched products
def test_bf16_member_keeps_its_perturbation(rank, tiny_model):
    """In a bf16 model a member's term is added to the layer's output, not folded into its bf16
    weight: the realised perturbation of the output tracks the intended one up to the output's own
    bf16 rounding (the term is ~1% of the output here), at least as well as a bf16 weight plus the
    same perturbation would (the tiny model's weights, std 0.1, against sigma 1e-3)."""
    sigma = 1e-3
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    layers = lowrank.select_layers(model, None, rank)
    layer = layers[0]
    pop = lowrank.Population(layers, SEEDS, SIGNS, sigma, rank)
    assert all(t.dtype == torch.float32 for t in pop.B + pop.At)  # drawn as the update draws them
    x = torch.randn(len(SEEDS), 5, layer.d_in, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    w = layer.weight.float()
    with torch.no_grad():
        base = layer.module(x).float()
        with pop.applied():
            realised = layer.module(x).float() - base
        explicit = [sign * sigma * lowrank.explicit_perturbation(layer, 0, seed, rank)
                    for seed, sign in zip(SEEDS, SIGNS)]
        intended = torch.stack([x[n].float() @ e.T for n, e in enumerate(explicit)])
        cast = torch.stack([x[n] @ (w + e).to(torch.bfloat16).T for n, e in enumerate(explicit)]).float() - base

    def corr(a, b):
        return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])

    assert corr(realised, intended) > 0.98, corr(realised, intended)  # measured 0.991 (rank 1) / 0.986 (rank 8)
    assert abs(float(realised.norm() / intended.norm()) - 1) < 0.03  # measured 1.000 / 1.016
    assert corr(cast, intended) < corr(realised, intended)  # measured 0.974 / 0.959


def test_update_equals_explicit_formula(tiny_model):
    model = copy.deepcopy(tiny_model)
    rank = 2
    layers = lowrank.select_layers(model, None, rank)
    params = fullrank.Params([(l.name, l.weight) for l in layers])
    before = [l.weight.detach().double().clone() for l in layers]
    seeds, coefs = [5, 6, 7], [3e-3, -1e-3, 2e-3]
    lowrank.apply_lowrank_update(params, layers, seeds, coefs, rank)
    for i, (layer, b) in enumerate(zip(layers, before)):
        expected = b.clone()
        for s, c in zip(seeds, coefs):
            a_, b_ = lowrank.factors(layer, i, s, rank)
            expected += c * (a_.double() @ b_.double().T) / math.sqrt(rank)
        assert torch.allclose(layer.weight.double(), expected, atol=1e-7, rtol=0), layer.name


def test_update_goes_through_the_fp32_master(tiny_model):
    """bf16 weights: the low-rank update lands in the fp32 master; the model is its rounding."""
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    layers = lowrank.select_layers(model, None, 1)
    params = fullrank.Params([(l.name, l.weight) for l in layers])
    for _ in range(3):
        lowrank.apply_lowrank_update(params, layers, [1, 2], [1e-4, -2e-4], 1)
    for layer, master in zip(layers, params.masters):
        assert master.dtype == torch.float32 and torch.equal(layer.weight, master.to(torch.bfloat16))


def test_layer_selection_errors(tiny_model):
    from trainers.es.noise.lowrank import LayerError

    assert len(lowrank.select_layers(tiny_model, r"mlp\.", 1)) == 2 * 3  # gate, up, down in 2 layers
    with pytest.raises(LayerError, match="--rank: must be >= 1"):
        lowrank.select_layers(tiny_model, None, 0)
    with pytest.raises(LayerError, match=r"--rank 33 exceeds what layer .*k_proj.weight allows \(min\(d_out, d_in\) = 32\)"):
        lowrank.select_layers(tiny_model, None, 33)  # k_proj: 2 kv heads x 16 = 32 outputs
    with pytest.raises(LayerError, match="--param-filter 'norm' matches no linear layer"):
        lowrank.select_layers(tiny_model, "norm", 1)


# ----- the ES trainer's batched evaluation: member rows -> per-member numbers -----------------------------


class ParityEnv(LetterEnv):
    """Reward and verdict vary with the completion: reward = its length mod 7, correct = even length."""

    def score_completion(self, completion, example):
        return Score(float(len(completion) % 7), len(completion) % 2 == 0)


#: Prompts of very different lengths (left padding differs per row)
PROMPTS = [chat("Say 3."), chat("What is the capital of France? Answer in one word, please, and then stop."),
           chat("the a an of to in is it that for on with as was be by this are or from at which but not")]


def batched_numbers(model, tokenizer, gen_batch_size, monkeypatch, *extra: str):
    """(rewards, accuracy, tokens, rows per generate call) of a mirrored population of 4 (two pairs)
    through ``es.evaluate_batched``."""
    from trainers.es import train as es
    from trainers.common import rollout

    cfg = es.resolve(["--env", "toy_envs:Letter-v0", "--noise", "lowrank", "--rank", "2", "--sigma", str(SIGMA),
                      "--population", "4", "--mirrored", "true", "--max-new-tokens", "8",
                      *(["--gen-batch-size", str(gen_batch_size)] if gen_batch_size else []), *extra])
    seeds, signs = es.population(cfg, 1)
    batch = [Example(f"p{i}", p, "a") for i, p in enumerate(PROMPTS)]
    calls = []
    real = rollout.rollout
    monkeypatch.setattr(es, "rollout", lambda engine, s, examples, *a, **k: calls.append(len(examples))
                        or real(engine, s, examples, *a, **k))
    arrays = [np.zeros(4) for _ in range(3)]
    es.evaluate_batched(cfg, HFEngine(model, tokenizer), BatchScorer(ParityEnv(), 0),
                        lowrank.select_layers(model, None, 2), batch, [(n, seeds[n], signs[n]) for n in range(4)], *arrays,
                        samples=es.sample_seeds(cfg, 1, len(batch)))
    return (*arrays, calls, seeds, signs, batch)


@pytest.mark.parametrize("gen_batch_size, calls", [(None, [12]), (6, [6, 6]), (2, [2, 1] * 4)])
def test_evaluate_batched_gives_each_member_its_own_mean_reward_accuracy_and_tokens(
        gen_batch_size, calls, tiny_model, tiny_tokenizer, monkeypatch):
    """Each member's numbers are those of that member evaluated alone (E added to its weights):
    mirrored pairs, prompts of varied lengths, one call or several."""
    rewards, accuracy, tokens, seen, seeds, signs, batch = batched_numbers(tiny_model, tiny_tokenizer, gen_batch_size,
                                                                           monkeypatch)
    assert seen == calls
    env = ParityEnv()
    for n, (seed, sign) in enumerate(zip(seeds, signs)):
        alone = generate(explicit_member(tiny_model, seed, sign, 2), tiny_tokenizer, PROMPTS, max_new_tokens=8)
        scores = [env.score_completion(text, e) for text, e in zip(alone.texts, batch)]
        assert rewards[n] == np.mean([s.reward for s in scores]), n
        assert accuracy[n] == np.mean([s.correct for s in scores]), n
        assert tokens[n] == sum(alone.num_tokens), n
    assert len(set(rewards)) > 2 and 0 < accuracy.mean() < 1, "members must differ, or the test proves nothing"


def test_gen_batch_size_caps_every_low_rank_call_below_the_prompts_per_member(tiny_model, tiny_tokenizer, monkeypatch):
    """--gen-batch-size 2 with 3 prompts per member: no call holds more than 2 rows (a member's
    prompts are split over calls), and every member's numbers are those of one call for all."""
    *split, seen, _, _, _ = batched_numbers(tiny_model, tiny_tokenizer, 2, monkeypatch)
    *whole, _, _, _, _ = batched_numbers(tiny_model, tiny_tokenizer, None, monkeypatch)
    assert max(seen) <= 2 and sum(seen) == 12
    for a, b in zip(split, whole):
        assert np.array_equal(a, b)


def test_sampled_members_are_each_the_mean_over_their_samples_on_common_seeds(tiny_model, tiny_tokenizer, monkeypatch):
    """--temperature 1 --samples-per-prompt 2: each member's numbers are those of that member alone,
    sampled with the iteration's seeds (the same for every member) over its 3 prompts x 2 samples,
    whether its rows come in one call or in calls of 2."""
    from trainers.es import train as es

    sampled = ["--temperature", "1", "--samples-per-prompt", "2"]
    rewards, accuracy, tokens, seen, seeds, signs, batch = batched_numbers(tiny_model, tiny_tokenizer, None,
                                                                           monkeypatch, *sampled)
    assert seen == [24]  # 4 members x 3 prompts x 2 samples, one call
    cfg = es.resolve(["--env", "toy_envs:Letter-v0", "--seed", "0", *sampled])
    row_seeds = es.sample_seeds(cfg, 1, 3)
    assert len(set(row_seeds)) == 6 and es.sample_seeds(cfg, 2, 3) != row_seeds  # per (prompt, sample), per iteration
    env = ParityEnv()
    for n, (seed, sign) in enumerate(zip(seeds, signs)):
        alone = generate(explicit_member(tiny_model, seed, sign, 2), tiny_tokenizer, [p for p in PROMPTS for _ in range(2)],
                         max_new_tokens=8, temperature=1.0, seed=row_seeds)
        scores = [env.score_completion(text, e) for text, e in zip(alone.texts, [e for e in batch for _ in range(2)])]
        assert rewards[n] == np.mean([s.reward for s in scores]), n
        assert tokens[n] == sum(alone.num_tokens), n
    split = batched_numbers(tiny_model, tiny_tokenizer, 2, monkeypatch, *sampled)
    assert max(split[3]) <= 2 and all(np.array_equal(a, b) for a, b in zip(split[:3], (rewards, accuracy, tokens)))
    greedy = batched_numbers(tiny_model, tiny_tokenizer, None, monkeypatch)
    assert not np.array_equal(greedy[0], rewards)  # sampling changed what the members were measured on


# ----- what low-rank mode cannot perturb: MoE experts -------------------------------------------------------


class RoutedExperts(torch.nn.Module):
    """A top-1 MoE block whose experts are separate nn.Linear modules (older transformers, custom
    code): each expert sees only the tokens routed to it."""

    def __init__(self, d: int):
        super().__init__()
        self.router = torch.nn.Linear(d, 2, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(2))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        choice = self.router(flat).argmax(-1)
        out = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            picked = (choice == i).nonzero().squeeze(-1)
            out[picked] = expert(flat[picked])
        return out.view_as(x)


def test_routed_expert_layers_are_refused(tiny_model):
    from trainers.es import train as es
    from trainers.es.noise.lowrank import LayerError

    model = copy.deepcopy(tiny_model)
    model.model.layers[0].mlp = RoutedExperts(64)
    cfg = es.resolve(["--env", "toy_envs:Letter-v0", "--noise", "lowrank"])
    with pytest.raises(LayerError, match=r"low-rank noise cannot perturb model\.layers\.0\.mlp\.experts\.\d\.weight: "
                                          r"it saw \d of the 8 token rows"):
        es.perturbable(model, cfg)
    es.perturbable(model, es.resolve(["--env", "toy_envs:Letter-v0", "--noise", "lowrank", "--param-filter",
                                      r"self_attn|layers\.1\."]))  # left out: accepted
    es.perturbable(tiny_model, cfg)  # a dense model: every layer sees every row


def tiny_mixtral_dir(tokenizer, path):
    """A 2-layer Mixtral: in transformers >= 5 its experts are fused 3-D parameters, not nn.Linear."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from trainers.common.models import save_model

    cfg = MixtralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=256, tie_word_embeddings=True,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    save_model(MixtralForCausalLM(cfg).eval(), tokenizer, path)
    return path


def test_the_perturbed_share_is_printed_and_a_small_one_warned(tiny_tokenizer, tiny_model_dir, tmp_path, capsys):
    from trainers.es import train as es

    import transformers

    args = ["--env", "Conciseness-v0", "--noise", "lowrank", "--iterations", "0", "--max-new-tokens", "2",
            "--eval-limit", "1"]
    mixtral = ["--model", str(tiny_mixtral_dir(tiny_tokenizer, tmp_path / "mixtral")), "--out", str(tmp_path / "a")]
    if int(transformers.__version__.split(".")[0]) < 5:  # experts are nn.Linear modules there: refused
        with pytest.raises(SystemExit):
            es.main([*args, *mixtral])
        assert "low-rank noise cannot perturb model.layers.0.block_sparse_moe.experts." in capsys.readouterr().err
        return
    es.main([*args, *mixtral])
    out = capsys.readouterr().out
    # q, k, v, o of 2 layers: 2 x (32x32 + 16x32 + 16x32 + 32x32) = 6,144 of 68,512 parameters
    assert "parameters perturbed (9.0% of the model; low-rank R=1 noise on 8 linear layers)" in out
    assert "dtype fp32 (forced by LLM_ENVS_CPU_BF16=0)" in out  # the start line names the dtype and why
    assert "warning: low-rank noise perturbs only 9.0% of this model's parameters" in out
    es.main([*args, "--model", str(tiny_model_dir), "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert "% of the model; low-rank" in out and "dtype fp32 (" in out and "warning" not in out
