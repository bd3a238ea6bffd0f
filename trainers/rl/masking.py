"""GRPO, Dr.GRPO and PPO on multi-turn episodes: the loss covers the model's tokens only.

A multi-turn response (``Samples.loss_masks`` set, ``trainers.common.episodes``) is everything
after the episode's first prompt: the model's turns (sampled ids, mask 1) and the env's replies
between them (bridge ids, mask 0). The policy, old and reference log-probs are all computed on the
whole sequence in one forward pass, the env's tokens as context; the loss mask then removes the
env's positions from every sum (loss, KL, clip fraction, token counts), so their log-probs are
never used. PPO's outcome reward goes on the last model token, and its GAE runs over the model's
tokens only, each turn's values bootstrapping from the next turn's first model token
(``model_token_gae``), as verl skips observation tokens.

Layout: GRPO and Dr.GRPO share a group's first prompt (``--shared-prefix``, the grouped layout: the
env's tokens sit inside the completions, attended to, and the loss reads ``loss_mask``); PPO uses
the padded layout for episodes (its value and GAE code reads the batch's ``mask``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainers.rl.logprobs import Grouped, Padded, batch_of, group, has_groups, pad
from trainers.rl.sampling import Samples


def samples_batch(samples: Samples, part: slice, pad_id: int, device: torch.device | str, shared: bool | None,
                  shared_episodes: bool = False) -> Padded | Grouped:
    """The tensors of a micro-batch: ``batch_of`` for single-turn samples. For episodes the batch
    attends to every token and carries ``loss_mask`` (1 on the model's tokens only): in the padded
    layout ``mask`` is the loss mask too (it is not read for attention there); with
    ``shared_episodes`` and ``shared``, the grouped layout (a group's first prompt once), whose
    ``mask`` stays the attention mask, so the loss must read ``loss_mask`` (GRPO does)."""
    if samples.loss_masks is None:
        return batch_of(samples.prompt_ids[part], samples.completion_ids[part], pad_id, device, shared)
    grouped = shared_episodes and (shared if shared is not None else has_groups(samples.prompt_ids[part]))
    batch = (group if grouped else pad)(samples.prompt_ids[part], samples.completion_ids[part], pad_id, device)
    loss = torch.zeros_like(batch.mask)
    for i, m in enumerate(samples.loss_masks[part]):
        loss[i, :len(m)] = torch.tensor(m, dtype=loss.dtype)
    batch.loss_mask = loss * batch.mask
    if not grouped:
        batch.mask = batch.loss_mask  # the attention mask was built from the whole sequence already
    return batch


def loss_mask(batch: Padded | Grouped) -> torch.Tensor:
    """The positions a loss sums over: the model's tokens of an episode, else every completion token."""
    return getattr(batch, "loss_mask", batch.mask)


def last_token(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` index of each row's last masked-in position (0 for a row with none)."""
    T = mask.shape[1]
    return torch.where(mask.bool().any(1), T - 1 - mask.bool().flip(1).int().argmax(1), torch.zeros_like(mask[:, 0]).long())


def model_token_gae(gae: Callable, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, lam: float):
    """``gae(rewards, values, mask, lam)`` over each row's model tokens alone (the env's tokens,
    mask 0, taken out and put back as zeros): for a right-padded mask, ``gae`` itself."""
    order = torch.argsort((~mask.bool()).to(torch.int8), dim=1, stable=True)  # model tokens first, in order
    dense_mask = mask.gather(1, order)
    advantages, returns = gae(rewards.gather(1, order), values.gather(1, order), dense_mask, lam)
    back = lambda x: torch.zeros_like(x).scatter(1, order, x) * mask  # noqa: E731
    return back(advantages), back(returns)
