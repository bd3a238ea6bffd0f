"""Group Relative Policy Optimization (GRPO, Shao et al. 2024) and Dr.GRPO (Liu et al. 2025,
"Understanding R1-Zero-Like Training"), on any llm_envs environment.

Each step samples G responses per prompt (temperature 1.0) for a few prompts and scores them with
the environment, exactly as ES does (the same generation, scoring, run directory and logs). Then,
for response i of a group with rewards R and per-token ratio r_t = pi(y_t) / pi_old(y_t):

    grpo:     A_i = (R_i - mean(R)) / (std(R) + 1e-6)     (std over the group, unbiased, as verl/TRL)
    dr_grpo:  A_i =  R_i - mean(R)                        (no std: no difficulty bias)

    per-token loss  l_t = -min(r_t A_i, clip(r_t, 1 - eps, 1 + eps) A_i) + beta * k3_t
    k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1    (KL to the frozen base model)

    grpo:     loss = sum_{i,t} l_t / (number of completion tokens in the step)     token-level mean
    dr_grpo:  loss = sum_{i,t} l_t / (number of responses * loss_norm)           no length normalisation

loss_norm defaults to the most tokens the model may write in one response: max_new_tokens, and on a
multi-turn env the episode's (max_turns x max_new_tokens, within its token budget), so that an
episode of several turns does not raise the effective learning rate. Dr.GRPO's beta defaults to 0
(no reference model is loaded).
With --epochs 1 (default) the ratio is 1 at the single step on each batch (old = current, detached),
as in TRL; --epochs K takes K optimizer steps on each batch, where the clip bites.

    python -m trainers.grpo --env Countdown-v0
    python -m trainers.grpo --env Countdown-v0 --loss dr_grpo
    python -m trainers.grpo --env Countdown-v0 --group-size 30 --max-samples 3000000
    python -m trainers.grpo --resume runs/grpo-Countdown-v0-...      # from the latest checkpoint
    torchrun --nproc-per-node 8 -m trainers.grpo --env Countdown-v0  # 8 processes, models sharded (FSDP2)

On W processes "the step" is every process's responses together: each rank divides its token sums
by the whole step's count, so W ranks take one process's step (``trainers.rl.sharding``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainers.common.config import check, resolve_config, run_main
from trainers.rl import loop
from trainers.rl.masking import loss_mask, samples_batch  # episodes: the loss on the model's tokens only
from trainers.rl.logprobs import token_logprobs
from trainers.rl.loop import RLConfig, uses_shared_prefix
from trainers.rl.losses import clipped_surrogate, kl_k3, masked_sum
from trainers.rl.policy import clip_and_step, split_batch
from trainers.rl.sampling import Samples
from trainers.rl.sharding import Ranks

STD_EPS = 1e-6


@dataclass
class GRPOConfig(RLConfig):
    group_size: int = field(default=8, metadata={"help": "G, sampled responses per prompt (the paper: 8 and 30)"})
    loss: str = field(default="grpo", metadata={"help": "grpo: std-normalised advantages, token-mean loss, KL; "
                                                        "dr_grpo: no std, token sums / constant, no KL by default",
                                                "choices": ["grpo", "dr_grpo"]})
    loss_norm: int | None = field(default=None, metadata={"help": "dr_grpo: per-response constant the token sums are "
                                                                  "divided by (default: the tokens the model may write "
                                                                  "in a response: max_new_tokens, times max_turns for "
                                                                  "a multi-turn episode)"})

    @property
    def algorithm(self) -> str:  # grpo or dr_grpo
        return self.loss

    def validate(self) -> None:
        super().validate()
        if self.beta is None:
            self.beta = 1e-3 if self.loss == "grpo" else 0.0
        check(self.group_size >= 2, "group_size", "must be >= 2 (advantages are relative to the group)")
        check(self.loss_norm is None or self.loss_norm >= 1, "loss_norm", "must be >= 1")


# ----- the algorithm ----------------------------------------------------------------------------


def group_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool) -> torch.Tensor:
    """Per-response advantages, relative to the response's group (rows of ``group_size``)."""
    r = rewards.view(-1, group_size)
    a = r - r.mean(dim=1, keepdim=True)
    if scale_by_std:
        a = a / (r.std(dim=1, keepdim=True) + STD_EPS)
    return a.view(-1)


def tied_groups(rewards: torch.Tensor, group_size: int) -> int:
    """How many groups (rows of ``group_size``) have every reward equal: their advantages are all 0,
    so they give no gradient (logged as ``frac_reward_zero_std``, TRL's name; near a zero base
    reward most groups are tied, the regime round three of the study asks about)."""
    r = rewards.view(-1, group_size)
    return int((r.max(dim=1).values == r.min(dim=1).values).sum())


def loss_denominator(loss: str, num_responses: int, num_tokens: int, loss_norm: int) -> float:
    """What the step's summed per-token losses are divided by (the same for every micro-batch, so
    gradient accumulation gives exactly the full-batch gradient)."""
    return float(num_tokens) if loss == "grpo" else float(num_responses * loss_norm)


def grpo_loss(logp, old_logp, advantages, mask, denominator: float, clip_eps: float, beta: float = 0.0,
              ref_logp=None):
    """The loss of a (micro-)batch, and its per-token sums for logging: ``[B, T]`` log-probs, ``[B]``
    advantages, ``[B, T]`` completion mask."""
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages[:, None], clip_eps)
    sums = {"clip_frac": masked_sum(clipped.float(), mask).item()}
    if beta:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + beta * kl
        sums["kl"] = masked_sum(kl.detach(), mask).item()
    return masked_sum(per_token, mask) / denominator, sums


@dataclass
class Batch:
    """A sampled batch ready for updates, split into micro-batches (per-token tensors per part)."""

    samples: Samples
    parts: list[slice]
    advantages: torch.Tensor  # [B]
    denominator: float
    old_logp: list[torch.Tensor] | None  # only with epochs > 1
    ref_logp: list[torch.Tensor] | None  # only with beta > 0


class GRPO:
    name = "GRPO"

    def __init__(self, cfg: GRPOConfig, model, tokenizer, ref=None, ranks: Ranks | None = None):
        self.cfg, self.model, self.ref = cfg, model, ref
        self.ranks = ranks or Ranks()  # the other processes (one process: none)
        self.pad_id = tokenizer.pad_token_id
        self.device = next(model.parameters()).device
        self.shared = uses_shared_prefix(cfg)  # each group's prompt computed once
        self.modules: dict[str, torch.nn.Module] = {}  # nothing trainable besides the policy
        if cfg.loss == "dr_grpo":
            self.name = "Dr.GRPO"

    @staticmethod
    def adapt(cfg: GRPOConfig, model) -> None:
        """Nothing to add to the policy's model (PPO adds its critic's adapter here)."""

    def param_groups(self) -> list[dict]:
        return [{"params": [p for p in self.model.parameters() if p.requires_grad]}]

    def padded(self, samples: Samples, part: slice):
        """A micro-batch's tensors: whole groups sharing their prompt, or one row per response."""
        return samples_batch(samples, part, self.pad_id, self.device, self.shared, shared_episodes=True)

    @torch.no_grad()
    def prepare(self, samples: Samples) -> Batch:
        cfg = self.cfg
        parts = split_batch(samples.prompt_ids, samples.completion_ids, self.shared, cfg.grad_accum,
                            cfg.micro_batch_tokens, self.ranks.max if self.ranks.sharded else None)
        advantages = group_advantages(samples.rewards, samples.group_size, cfg.loss == "grpo").to(self.device)
        # the whole step's responses and tokens, over every process (each holds whole groups)
        responses, tokens = self.ranks.sum([len(samples), samples.num_tokens])
        norm = cfg.loss_norm or samples.response_budget or cfg.max_new_tokens  # a response: one turn, or an episode
        denominator = loss_denominator(cfg.loss, int(responses), int(tokens), norm)
        old = [token_logprobs(self.model, self.padded(samples, p), cfg.temperature) for p in parts] \
            if cfg.epochs > 1 else None
        ref = [token_logprobs(self.ref, self.padded(samples, p), cfg.temperature) for p in parts] \
            if cfg.beta else None
        return Batch(samples, parts, advantages, denominator, old, ref)

    def update(self, batch: Batch, optimizer) -> dict[str, float]:
        """One optimizer step on the whole sampled batch (micro-batch gradients accumulated)."""
        cfg = self.cfg
        self.model.train()
        loss_total, sums = 0.0, {}
        for k, part in enumerate(batch.parts):
            self.ranks.gradient_sync(k == len(batch.parts) - 1)  # FSDP: reduce once, after the last micro-batch
            mb = self.padded(batch.samples, part)
            logp = token_logprobs(self.model, mb, cfg.temperature)
            old = batch.old_logp[k] if batch.old_logp else logp.detach()
            ref = batch.ref_logp[k] if batch.ref_logp else None
            loss, part_sums = grpo_loss(logp, old, batch.advantages[part], loss_mask(mb), batch.denominator,
                                        cfg.clip_eps, cfg.beta, ref)
            loss.backward()
            loss_total += loss.item()
            for key, v in part_sums.items():
                sums[key] = sums.get(key, 0.0) + v
        [grad_norm] = clip_and_step(optimizer, cfg.max_grad_norm)
        self.model.eval()
        # the whole batch's statistics: sums over every process
        keys = sorted(sums)
        group_size = batch.samples.group_size
        loss_total, responses, tokens, advantage_abs, tied, *values = self.ranks.sum(
            [loss_total, len(batch.samples), batch.samples.num_tokens, float(batch.advantages.abs().sum()),
             tied_groups(batch.samples.rewards, group_size), *(sums[k] for k in keys)])
        tokens = float(max(1.0, tokens))
        return {"loss": float(loss_total), "grad_norm": grad_norm, **{k: float(v / tokens) for k, v in zip(keys, values)},
                "advantage_abs": float(advantage_abs / responses),
                "frac_reward_zero_std": float(tied * group_size / responses)}


# ----- the run ----------------------------------------------------------------------------------


def train(cfg: GRPOConfig):
    return loop.train(cfg, GRPO)


def resolve(argv: list[str] | None = None) -> GRPOConfig:
    return resolve_config(GRPOConfig, lambda c: c.loss, argv, description=__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> None:
    run_main(resolve, train, argv)
