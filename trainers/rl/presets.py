"""GRPO's and PPO's sizes per environment: the trainers' defaults (the ``paper`` preset: GRPO's G=8
of the paper's Table 5 grid, PPO's batch of 16) and a CPU preset each (``CPU_PRESETS``: a step in
minutes on a 2-core CPU with the default model), chosen between by ``--preset`` as ES's are
(``trainers/common/sizing.py``), and what a step costs on this device (``rl_fit``).

A CPU preset samples 8 responses per step (Conciseness-v0: 16), at learning rate 1e-5, for 20 steps
(Conciseness-v0: 12, docs/rl.md's GRPO run, whose held-out reward moved from -101.5 to -15.75), with
the env's CPU generation budget and held-out size (``sizing.cpu_env``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import llm_envs
from trainers.common.sizing import Choice, Pace, choose_preset, cpu_env, probe_pace, probe_rows

#: Per family (grpo covers Dr.GRPO), the CPU preset's batch and run; per env overrides below.
CPU_FAMILY: dict[str, dict[str, Any]] = {
    "grpo": dict(batch_size=2, group_size=4, lr=1e-5, steps=20, eval_every=10, checkpoint_every=10),
    "ppo": dict(batch_size=4, group_size=2, lr=1e-5, steps=20, eval_every=10, checkpoint_every=10),
}
#: Conciseness-v0's two training prompts, 8 responses each, as docs/rl.md's GRPO run. ARC-AGI-v0's
#: prompts run to 10,000 tokens: without these, GRPO's and PPO's first updates were killed for memory
#: on a 24 GB machine (22.5 GB resident; docs/es.md), so its preset recomputes activations and packs
#: each micro-batch to at most 8,192 tokens (a longer row alone): a step then peaks at 7.9 GB (GRPO)
#: and 12.7 GB (PPO).
CPU_PRESETS: dict[str, dict[str, Any]] = {
    "Conciseness-v0": dict(batch_size=2, group_size=8, steps=12, eval_every=4, checkpoint_every=4),
    "ARC-AGI-v0": dict(gradient_checkpointing=True, micro_batch_tokens=8192),
}


def rl_cpu_preset(env: llm_envs.TaskEnv, env_id: str, family: str) -> dict[str, Any]:
    """The CPU preset of ``env_id`` for ``family`` (grpo or ppo)."""
    return CPU_FAMILY[family] | CPU_PRESETS.get(env_id, {}) | cpu_env(env_id, env.max_new_tokens)


def family_of(cfg) -> str:
    """The preset family of ``cfg``'s algorithm: ppo, or grpo (Dr.GRPO too)."""
    return "ppo" if cfg.algorithm == "ppo" else "grpo"


def update_passes(cfg) -> float:
    """Forward-pass equivalents per token of a step's update: the policy's forward and backward (~3)
    per epoch, the reference's log-probs (beta > 0), the old log-probs (several epochs), and PPO's
    critic (its values, and its own forward and backward per epoch unless it shares the policy's trunk);
    with gradient checkpointing, each trained forward once more (recomputed in the backward pass)."""
    train = 4.0 if cfg.gradient_checkpointing else 3.0
    passes = train * cfg.epochs + (1 if cfg.beta else 0) + (1 if cfg.epochs > 1 else 0)
    if cfg.algorithm == "ppo":
        passes += 1 + (0 if getattr(cfg, "shared_critic", False) else train * cfg.epochs)
    return passes


def rl_fit(cfg, ranks, engine, env: llm_envs.TaskEnv, train_examples, device: str,
           shared_prefix: Callable[[Any], bool]) -> Choice:
    """Probe this device (process 0; every process gets its pace), then choose ``cfg``'s preset and set
    its values (``sizing.choose_preset``). A step costs this process's sampling (rows scaled from the probe)
    and its update, ``update_passes`` forward passes over its tokens (a group's prompt once with
    ``shared_prefix``)."""
    env_id = llm_envs.registry.resolve_id(cfg.env)
    train = len(train_examples)
    family = family_of(cfg)

    def seconds(c) -> float:
        prompts = math.ceil(min(c.batch_size, train) / ranks.world)
        rows = prompts * c.group_size
        prompt_tokens = (prompts if shared_prefix(c) else rows) * pace.prompt_tokens
        update = pace.forward(prompt_tokens + rows * c.max_new_tokens) * update_passes(c)
        return pace.generation(rows, c.max_new_tokens, prompts) + update

    def shape(c) -> str:
        return f"{min(c.batch_size, train)} prompts x {c.group_size} responses, lr {c.lr:g}"

    pace = None
    if ranks.is_main:
        rows = probe_rows(device, cfg.gen_batch_size, min(cfg.batch_size, train) * cfg.group_size)
        pace = probe_pace(engine, [e.prompt for e in train_examples[:rows]], device, rows, cfg.temperature)
    pace: Pace = ranks.broadcast(pace)
    return choose_preset(cfg, rl_cpu_preset(env, env_id, family), shape,
                         lambda c: min(c.batch_size, train) * c.group_size, seconds, "step", pace, units="steps")
