"""Proximal Policy Optimization (Schulman et al. 2017) for LLM fine-tuning, TinyZero/verl style, on
any llm_envs environment.

The critic is a separate model, as in the paper's PPO (verl): a trainable copy of the base model's
trunk with a linear value head, its own learning rate (--value-lr) and its own gradient clip; it
scores every completion position. (--shared-critic puts the value head on the policy's own hidden
states instead: one model, about half the memory, but the value loss then moves the policy's
weights too.) Each sampled batch is turned into per-token rewards and advantages:

    reward_t  = -beta * kl_t                      (kl_t = logp_t - ref_t by default, k3 optional)
              + R          at the last token      (the environment's outcome reward)
    delta_t   = reward_t + V_{t+1} - V_t          (gamma = 1; V after the last token = 0)
    A_t       = sum_k lambda^k delta_{t+k}        (GAE), returns G_t = A_t + V_t,
                then A whitened over the batch's tokens

and each optimizer step minimises the token-mean (over all completion tokens of the batch) of

    -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)
    + vf_coef * 0.5 * max((V_t - G_t)^2, (clip(V_t, V_old - c, V_old + c) - G_t)^2)

with r_t = pi(y_t) / pi_old(y_t) (old: the policy that sampled the batch).

Memory per parameter of the base model, before activations: policy 16 bytes (fp32 weights,
gradients, AdamW's two moments), critic 16 (the same for its trunk), frozen reference 2 (bf16 on
CUDA; 4 on CPU): ~34 bytes, ~18 with --shared-critic. A 7B model needs ~238 GB (~126 GB shared): it
does not fit one 80 GB GPU, where about 2B parameters do (about 4B with --shared-critic, or for
GRPO). On W GPUs (torchrun) all of it is sharded, 1/W per GPU, plus the engine's copy of the
weights (``trainers.rl.sharding``); the token mean and the whitening are then over every process's
tokens.

With ``--lora-rank R`` the policy trains a LoRA adapter on the frozen base, and the critic is a
second adapter ("critic") on the same frozen base plus the value head: one copy of the base weights.

    python -m trainers.ppo --env Countdown-v0
    python -m trainers.ppo --env Countdown-v0 --lam 0.95 --epochs 2
    python -m trainers.ppo --resume runs/ppo-Countdown-v0-...        # from the latest checkpoint
    torchrun --nproc-per-node 8 -m trainers.ppo --env Countdown-v0   # 8 processes, models sharded (FSDP2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from trainers.common import adapters
from trainers.common.config import check, resolve_config, run_main
from trainers.rl import loop
from trainers.common.models import compute_dtype
from trainers.rl.masking import last_token, model_token_gae, samples_batch
from trainers.rl.logprobs import completion_states, token_logprobs
from trainers.rl.loop import RLConfig, uses_shared_prefix
from trainers.rl.losses import KL_ESTIMATORS, clipped_surrogate, masked_sum, masked_whiten
from trainers.rl.policy import clip_and_step, load_critic_trunk, split_batch
from trainers.rl.sampling import Samples
from trainers.rl.sharding import Ranks


#: The name of the critic's adapter (``--lora-rank`` without ``--shared-critic``).
CRITIC = "critic"


@dataclass
class PPOConfig(RLConfig):
    algorithm: ClassVar[str] = "ppo"

    batch_size: int = field(default=16, metadata={"help": "training prompts per sampled batch"})
    group_size: int = field(default=1, metadata={"help": "sampled responses per prompt"})
    lam: float = field(default=1.0, metadata={"help": "GAE lambda (gamma is 1)"})
    vf_coef: float = field(default=0.1, metadata={"help": "weight of the value loss"})
    value_clip: float = field(default=0.2, metadata={"help": "clip range of the value prediction around the old value"})
    value_lr: float = field(default=1e-5, metadata={"help": "learning rate of the critic (its trunk and value head; "
                                                            "with --shared-critic, of the value head only)"})
    shared_critic: bool = field(default=False, metadata={"help": "the value head reads the policy's own hidden states "
                                                                 "instead of a separate critic model: ~half PPO's "
                                                                 "memory (no second trunk and its AdamW state), but "
                                                                 "the value loss then also trains the policy's "
                                                                 "weights, unlike the paper's PPO"})
    kl_estimator: str = field(default="k1", metadata={"help": "per-token KL in the reward: k1 = logp - ref, k3 = exp(ref - logp) - (ref - logp) - 1",
                                                      "choices": ["k1", "k3"]})
    whiten_advantages: bool = field(default=True, metadata={"help": "normalise advantages over the batch's tokens"})

    def validate(self) -> None:
        super().validate()
        if self.beta is None:
            self.beta = 1e-3
        check(0 <= self.lam <= 1, "lam", "must be in [0, 1]")
        check(self.vf_coef >= 0, "vf_coef", "must be >= 0")
        check(self.value_clip > 0, "value_clip", "must be > 0")
        check(self.value_lr > 0 and math.isfinite(self.value_lr), "value_lr", "must be a positive number")


# ----- the algorithm ----------------------------------------------------------------------------


class ValueHead(torch.nn.Module):
    """V(s_t): a linear map of the last hidden state, zero-initialised (V = 0 before training)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


def token_rewards(outcome: torch.Tensor, kl: torch.Tensor | None, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """``[B, T]`` rewards: ``-beta * kl`` on every completion token, plus the outcome at the last one."""
    rewards = torch.zeros_like(mask) if kl is None else -beta * kl * mask
    last = last_token(mask)  # an episode's last model token (env tokens, mask 0, may follow none)
    rewards[torch.arange(len(last)), last] += outcome.to(rewards)
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, lam: float, gamma: float = 1.0):
    """Generalised advantage estimates and returns ``[B, T]``; the value after a completion's last
    token is 0 (the episode ends there)."""
    values = values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    T = rewards.shape[1]
    for t in reversed(range(T)):
        alive = mask[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        next_value = values[:, t + 1] * alive if t + 1 < T else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running * alive
        advantages[:, t] = running
    return advantages * mask, (advantages + values) * mask


def ppo_loss(logp, old_logp, advantages, values, old_values, returns, mask, denominator: float,
             clip_eps: float, value_clip: float, vf_coef: float):
    """Clipped policy loss + vf_coef * clipped value loss (token sums / ``denominator``), and
    per-token sums for logging."""
    pg, clipped = clipped_surrogate(logp, old_logp, advantages, clip_eps)
    v_clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    vf = 0.5 * torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    loss = (masked_sum(pg, mask) + vf_coef * masked_sum(vf, mask)) / denominator
    return loss, {"pg_loss": masked_sum(pg.detach(), mask).item(), "value_loss": masked_sum(vf.detach(), mask).item(),
                  "clip_frac": masked_sum(clipped.float(), mask).item()}


@dataclass
class Batch:
    """A sampled batch with its per-token old log-probs, old values, advantages and returns (one
    ``[b, T_part]`` tensor per micro-batch)."""

    samples: Samples
    parts: list[slice]
    old_logp: list[torch.Tensor]
    old_values: list[torch.Tensor]
    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]
    kl: float  # mean per-token KL estimate to the reference (0 without one)
    value_mean: float  # mean old value over the completion tokens
    tokens: float  # completion tokens of the whole batch (every process's): the loss's denominator


class PPO:
    name = "PPO"

    def __init__(self, cfg: PPOConfig, model, tokenizer, ref=None, ranks: Ranks | None = None):
        self.cfg, self.model, self.ref = cfg, model, ref
        self.ranks = ranks or Ranks()  # the other processes (one process: none)
        self.pad_id = tokenizer.pad_token_id
        self.device = next(model.parameters()).device
        self.shared = uses_shared_prefix(cfg)  # each group's prompt computed once (--group-size > 1)
        # The critic: a separate trunk, a fresh copy of the base model (None: the policy's own); with
        # adapters, the policy's frozen base with an adapter of its own ("critic", saved with the policy's).
        self.critic_adapter = cfg.lora and not cfg.shared_critic
        if self.critic_adapter:
            self.adapt(cfg, model)
            self.trunk = adapters.WithAdapter(model, model.get_base_model().base_model, CRITIC)
        else:
            self.trunk = None if cfg.shared_critic else load_critic_trunk(cfg.model, str(self.device),
                                                                          cfg.gradient_checkpointing, compute_dtype(model))
        self.value_head = ValueHead(model.config.hidden_size).to(self.device)
        self.modules = {"value_head": self.value_head}  # saved with checkpoints, restored on resume
        if self.trunk is not None and not self.critic_adapter:
            self.modules["critic_trunk"] = self.trunk

    @staticmethod
    def adapt(cfg: PPOConfig, model) -> None:
        """With adapters and a separate critic: the critic's adapter on the policy's model (fresh, or
        the one a checkpoint held), added before the loop copies the model for the engine or shards it."""
        if cfg.lora and not cfg.shared_critic and CRITIC not in model.peft_config:
            adapters.add_adapter(model, CRITIC, cfg.seed)

    def param_groups(self) -> list[dict]:
        """The policy's parameters, then the critic's (its own learning rate and gradient clip)."""
        if self.critic_adapter:
            trunk = [p for _, p in adapters.adapter_parameters(self.model, CRITIC)]
            policy = [p for _, p in adapters.adapter_parameters(self.model)]
        else:
            trunk = [] if self.trunk is None else list(self.trunk.parameters())
            policy = [p for p in self.model.parameters() if p.requires_grad]
        critic = trunk + list(self.value_head.parameters())
        return [{"params": policy},
                {"params": critic, "lr": self.cfg.value_lr}]

    def forward(self, samples: Samples, part: slice):
        """(log-probs, values, mask) of one micro-batch under the current policy and critic."""
        mb = samples_batch(samples, part, self.pad_id, self.device, self.shared)  # episodes: model tokens only
        if self.trunk is None:
            logp, hidden = token_logprobs(self.model, mb, self.cfg.temperature, hidden=True)
        else:
            logp, hidden = token_logprobs(self.model, mb, self.cfg.temperature), completion_states(self.trunk, mb)
        return logp, self.value_head(hidden), mb

    def train_mode(self, on: bool) -> None:
        for module in (self.model, None if self.critic_adapter else self.trunk, self.value_head):
            if module is not None:
                module.train(on)

    @torch.no_grad()
    def prepare(self, samples: Samples) -> Batch:
        cfg = self.cfg
        parts = split_batch(samples.prompt_ids, samples.completion_ids, self.shared, cfg.grad_accum,
                            cfg.micro_batch_tokens, self.ranks.max if self.ranks.sharded else None)
        old_logp, old_values, masks, rewards, kl_sum = [], [], [], [], 0.0
        for part in parts:
            logp, values, mb = self.forward(samples, part)
            kl = None
            if self.ref is not None:
                kl = KL_ESTIMATORS[cfg.kl_estimator](logp, token_logprobs(self.ref, mb, cfg.temperature))
                kl_sum += masked_sum(kl, mb.mask).item()
            old_logp.append(logp)
            old_values.append(values)
            masks.append(mb.mask)
            rewards.append(token_rewards(samples.rewards[part].to(self.device), kl, mb.mask, cfg.beta))
        # GAE per micro-batch (rows are independent); whitening over the whole batch's tokens
        # (every process's: their masked sums are added up).
        adv_ret = [model_token_gae(gae, r, v, m, cfg.lam) for r, v, m in zip(rewards, old_values, masks)]
        advantages, returns = [a for a, _ in adv_ret], [g for _, g in adv_ret]
        if cfg.whiten_advantages:
            width = max(m.shape[1] for m in masks)
            flat = lambda xs: torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in xs])  # noqa: E731
            white = masked_whiten(flat(advantages), flat(masks), total=self.ranks.sum_tensor)
            advantages = [white[p][:, :m.shape[1]] for p, m in zip(parts, masks)]
        value_sum = sum(masked_sum(v, m).item() for v, m in zip(old_values, masks))
        tokens, kl_sum, value_sum = self.ranks.sum([samples.num_tokens, kl_sum, value_sum])
        tokens = float(max(1.0, tokens))
        return Batch(samples, parts, old_logp, old_values, advantages, returns, float(kl_sum / tokens),
                     float(value_sum / tokens), tokens)

    def update(self, batch: Batch, optimizer) -> dict[str, float]:
        """One optimizer step on the whole sampled batch (micro-batch gradients accumulated)."""
        cfg = self.cfg
        self.train_mode(True)
        denominator = batch.tokens  # the whole batch's tokens: W processes take one process's step
        loss_total, sums = 0.0, {}
        for k, part in enumerate(batch.parts):
            self.ranks.gradient_sync(k == len(batch.parts) - 1)  # FSDP: reduce once, after the last micro-batch
            logp, values, mb = self.forward(batch.samples, part)
            loss, part_sums = ppo_loss(logp, batch.old_logp[k], batch.advantages[k], values, batch.old_values[k],
                                       batch.returns[k], mb.mask, denominator, cfg.clip_eps, cfg.value_clip,
                                       cfg.vf_coef)
            loss.backward()
            loss_total += loss.item()
            for key, v in part_sums.items():
                sums[key] = sums.get(key, 0.0) + v
        grad_norm, value_grad_norm = clip_and_step(optimizer, cfg.max_grad_norm)  # each clipped on its own
        self.train_mode(False)
        keys = sorted(sums)
        loss_total, *values = self.ranks.sum([loss_total, *(sums[k] for k in keys)])  # over every process
        return {"loss": float(loss_total), "grad_norm": grad_norm, "value_grad_norm": value_grad_norm, "kl": batch.kl,
                **{k: float(v / denominator) for k, v in zip(keys, values)}, "value_mean": batch.value_mean}


# ----- the run ----------------------------------------------------------------------------------


def train(cfg: PPOConfig):
    return loop.train(cfg, PPO)


def resolve(argv: list[str] | None = None) -> PPOConfig:
    return resolve_config(PPOConfig, "ppo", argv, description=__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> None:
    run_main(resolve, train, argv)
