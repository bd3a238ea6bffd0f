"""GRPO, Dr.GRPO and PPO on multi-turn episodes: the loss covers the model's tokens only."""

from __future__ import annotations

import copy

import pytest
import torch

import llm_envs
from tests.test_multiturn import Scripted
from trainers.rl.grpo import GRPO, GRPOConfig, group_advantages, grpo_loss, loss_denominator
from trainers.rl.ppo import gae, token_rewards
from trainers.rl.masking import last_token, loss_mask, model_token_gae, samples_batch
from trainers.rl.logprobs import Grouped, Padded, token_logprobs
from trainers.rl.losses import kl_k3
from trainers.rl.sampling import Samples, sample


def two_turn_samples(tokenizer) -> Samples:
    """A group of two episodes of GuessNumber-v0 (two turns each: guess, "Higher.", guess), made
    by the batched runner with scripted turns; rewards set by hand."""
    env = llm_envs.make("GuessNumber-v0", max_turns=2)
    engine = Scripted(tokenizer, ["<guess>0</guess>", "<guess>1</guess> ok"])
    s = sample(engine, env, env.examples("test")[:1], 2, 16)
    s.rewards = torch.tensor([1.0, 0.0])
    s.completion_ids[1] = s.completion_ids[1][:-2]  # ragged: the second episode's last turn is shorter
    s.loss_masks[1] = s.loss_masks[1][:-2]
    return s


def test_episode_samples_hold_exact_ids_and_a_loss_mask(tiny_tokenizer):
    s = two_turn_samples(tiny_tokenizer)
    mask = s.loss_masks[0]
    assert 0 in mask and mask[0] == 1 and mask[-1] == 1  # model turn, env bridge, model turn
    second = [t for t, m in zip(s.completion_ids[0], mask) if m][-len(tiny_tokenizer("<guess>1</guess> ok")["input_ids"]) - 1:]
    assert tiny_tokenizer.decode(second) == "<guess>1</guess> ok<|im_end|>"
    assert s.num_tokens == sum(mask) + sum(s.loss_masks[1])


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "padded"])
def test_two_turn_loss_is_the_hand_computed_sum_over_the_models_tokens(shared, tiny_model, tiny_tokenizer):
    s = two_turn_samples(tiny_tokenizer)
    model, ref = copy.deepcopy(tiny_model).float(), copy.deepcopy(tiny_model).float()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = GRPOConfig(env="GuessNumber-v0", group_size=2, max_new_tokens=16, beta=0.1, epochs=2,
                     shared_prefix="on" if shared else "off")
    cfg.validate()
    algo = GRPO(cfg, model, tiny_tokenizer, ref=ref)
    batch = algo.prepare(s)
    mb = algo.padded(s, slice(0, 2))
    assert isinstance(mb, Grouped if shared else Padded)
    logp = token_logprobs(model, mb)
    loss, _ = grpo_loss(logp, batch.old_logp[0], batch.advantages, loss_mask(mb), batch.denominator, cfg.clip_eps,
                        cfg.beta, batch.ref_logp[0])

    # by hand: each episode unpadded, one forward pass, the model's positions only
    adv = group_advantages(s.rewards, 2, True)
    tokens = sum(sum(m) for m in s.loss_masks)
    assert batch.denominator == loss_denominator("grpo", 2, tokens, 16)
    total = 0.0
    for i, (p, c, m) in enumerate(zip(s.prompt_ids, s.completion_ids, s.loss_masks)):
        with torch.no_grad():
            own = model(torch.tensor([p + c])).logits[0].log_softmax(-1)
            theirs = ref(torch.tensor([p + c])).logits[0].log_softmax(-1)
        for t, (tok, keep) in enumerate(zip(c, m)):
            if keep:  # ratio 1 (old = current): -A + beta * k3
                lp, rp = own[len(p) - 1 + t, tok], theirs[len(p) - 1 + t, tok]
                total += float(-adv[i] + cfg.beta * kl_k3(lp, rp))
    assert loss.item() == pytest.approx(total / tokens, rel=1e-5, abs=1e-6)
    # the env's tokens would change it: the same sum over every token is another number
    everything = samples_batch(Samples(s.examples, s.prompt_ids, s.completion_ids, s.texts, s.rewards, s.correct, 2),
                               slice(0, 2), tiny_tokenizer.pad_token_id, "cpu", False)
    other, _ = grpo_loss(token_logprobs(model, everything), batch.old_logp[0], batch.advantages, everything.mask,
                         batch.denominator, cfg.clip_eps, cfg.beta, token_logprobs(ref, everything))
    assert abs(other.item() - loss.item()) > 1e-4


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "padded"])
def test_the_policy_logprobs_are_those_of_the_sampled_ids(shared, tiny_model, tiny_tokenizer):
    s = two_turn_samples(tiny_tokenizer)
    mb = samples_batch(s, slice(0, 2), tiny_tokenizer.pad_token_id, "cpu", True, shared_episodes=shared)
    logp = token_logprobs(tiny_model, mb)
    p, c = s.prompt_ids[0], s.completion_ids[0]
    with torch.no_grad():
        full = tiny_model(torch.tensor([p + c])).logits[0].log_softmax(-1)
    expected = torch.stack([full[len(p) - 1 + t, tok] for t, tok in enumerate(c)])
    assert torch.allclose(logp[0, :len(c)], expected, atol=1e-5)
    assert loss_mask(mb)[0, :len(c)].tolist() == [float(m) for m in s.loss_masks[0]]
    assert mb.mask[0, :len(c)].tolist() == ([1.0] * len(c) if shared else [float(m) for m in s.loss_masks[0]])


def test_ppo_credits_turns_through_the_models_tokens_only():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    assert last_token(mask).tolist() == [5, 2]
    rewards = token_rewards(torch.tensor([1.0, 2.0]), None, mask, 0.0)
    assert rewards[0].tolist() == [0, 0, 0, 0, 0, 1, 0] and rewards[1].tolist() == [0, 0, 2, 0, 0, 0, 0]
    values = torch.arange(14, dtype=torch.float32).view(2, 7) / 10
    adv, ret = model_token_gae(gae, rewards, values, mask, 0.9)
    dense = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    a0, r0 = gae(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), values[0, [0, 1, 4, 5]][None], dense, 0.9)
    assert torch.allclose(adv[0, [0, 1, 4, 5]], a0[0]) and torch.allclose(ret[0, [0, 1, 4, 5]], r0[0])
    assert adv[0, [2, 3, 6]].abs().sum() == 0
    a1, r1 = gae(rewards[1:], values[1:], mask[1:], 0.9)  # a contiguous mask: gae itself
    assert torch.equal(adv[1:], a1) and torch.equal(ret[1:], r1)


def test_dr_grpos_normaliser_is_an_episodes_token_budget(tiny_model, tiny_tokenizer):
    """D8: Dr.GRPO divides each response's token sum by a constant, the most tokens it may hold:
    max_new_tokens for one turn, max_turns x max_new_tokens for an episode, so an episode of several
    turns does not multiply the effective learning rate."""
    s = two_turn_samples(tiny_tokenizer)  # GuessNumber-v0, max_turns 2, 16 new tokens per turn
    assert s.response_budget == 2 * 16
    cfg = GRPOConfig(env="GuessNumber-v0", group_size=2, max_new_tokens=16, loss="dr_grpo")
    cfg.validate()
    assert GRPO(cfg, tiny_model, tiny_tokenizer).prepare(s).denominator == 2 * (2 * 16)
    cfg.loss_norm = 7  # given: it stands
    assert GRPO(cfg, tiny_model, tiny_tokenizer).prepare(s).denominator == 2 * 7
    single = sample(Scripted(tiny_tokenizer, ["a"]), llm_envs.make("toy_envs:CheapEcho-v0"),
                    llm_envs.make("toy_envs:CheapEcho-v0").examples("test")[:1], 1, 16)
    assert single.response_budget == 16
