"""ES's sizes per environment: the paper's hyperparameters (``PAPER_DEFAULTS``, the ``paper``
preset) and a CPU preset each (``CPU_PRESETS``: an iteration in minutes on a 2-core CPU with the
default model), chosen between by ``--preset`` (``trainers/common/sizing.py``: ``auto`` keeps the
paper's unless a probe says its iteration would take over ~2 h here), and what an iteration costs
on this device (``es_fit``). docs/es.md#sized-to-the-machine has the table and each preset's
measured time.

The CPU presets take the main job's hyperparameters (``benchmarks/configs/es_conciseness_cpu.yaml``:
N=8 mirrored pairs, sigma 5e-4, alpha 1.5e-3 for the 135M default model, whose weights are ~2.5x
larger than a 7B model's), a few prompts per iteration, a shorter generation budget and a short run
with held-out evaluations on the first examples of the split (``sizing.cpu_env``).
"""

from __future__ import annotations

import math
from typing import Any

import llm_envs
from trainers.common.sizing import Choice, Pace, choose_preset, cpu_env, probe_pace, probe_rows
from trainers.es.noise.members import FullRankMember, LowRankMembers

# The paper's hyperparameters per environment (PAPER_NOTES.md); flags override them.
PAPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "Countdown-v0": dict(population=30, sigma=1e-3, alpha=5e-4, iterations=500),
    "Conciseness-v0": dict(population=30, sigma=1e-3, alpha=5e-4, iterations=1000),
    "MATH-v0": dict(population=30, sigma=1e-3, alpha=5e-4, iterations=300),
    "Sudoku-v0": dict(population=32, sigma=1e-3, alpha=5e-4, iterations=2500),
    "ARC-AGI-v0": dict(population=50, sigma=1e-3, alpha=3e-4, iterations=1500),
}
GENERIC_DEFAULTS = dict(population=30, sigma=1e-3, alpha=5e-4, iterations=500)

#: What every ES CPU preset shares: the main job's population and step sizes.
CPU_COMMON = dict(population=8, mirrored=True, sigma=5e-4, alpha=1.5e-3)
#: Per env, the rest of its CPU preset (``sizing.cpu_env`` adds the generation budget and eval size).
CPU_PRESETS: dict[str, dict[str, Any]] = {
    "Sudoku-v0": dict(batch_size=4, iterations=20, eval_every=10, checkpoint_every=10),
    "Countdown-v0": dict(batch_size=4, iterations=20, eval_every=10, checkpoint_every=10),
    "MATH-v0": dict(batch_size=2, iterations=10, eval_every=5, checkpoint_every=5),
    "ARC-AGI-v0": dict(batch_size=2, iterations=10, eval_every=5, checkpoint_every=5),
    # the main job (benchmarks/configs/es_conciseness_cpu.yaml) without its fp32 and hf pins
    "Conciseness-v0": dict(iterations=8, eval_every=4, checkpoint_every=4),
}
CPU_OTHER = dict(batch_size=4, iterations=20, eval_every=10, checkpoint_every=10)


def es_cpu_preset(env: llm_envs.TaskEnv, env_id: str) -> dict[str, Any]:
    """The CPU preset of ``env_id`` (other envs: ``CPU_OTHER``)."""
    return CPU_COMMON | CPU_PRESETS.get(env_id, CPU_OTHER) | cpu_env(env_id, env.max_new_tokens)


def es_fit(cfg, dist, engine, env: llm_envs.TaskEnv, params, layers, train_examples, device: str) -> Choice:
    """Probe this device (process 0; every process gets its pace), then choose ``cfg``'s preset and set
    its values (``sizing.choose_preset``). An iteration costs this process's members' generations (rows
    scaled from the probe; full-rank: each member's noise work, and the update's, about half a
    member's per distinct seed)."""
    env_id = llm_envs.registry.resolve_id(cfg.env)
    train = len(train_examples)

    def prompts(c) -> int:
        return min(c.batch_size or train, train)

    def seconds(c) -> float:
        members = math.ceil(c.population / dist.world)  # process 0's share, the largest
        rows = members * prompts(c) * c.samples_per_prompt
        noise = 0.0
        if c.noise == "full":
            distinct = c.population // 2 if c.mirrored else c.population
            noise = (members + distinct / 2) * pace.member_seconds
        return pace.generation(rows, c.max_new_tokens, members * prompts(c)) + noise

    def shape(c) -> str:
        samples = f" x {c.samples_per_prompt} samples" if c.samples_per_prompt > 1 else ""
        return f"N={c.population}{' mirrored' if c.mirrored else ''} x {prompts(c)} prompts{samples}"

    pace = None
    if dist.is_main:
        rows = probe_rows(device, cfg.gen_batch_size or 32, prompts(cfg) * cfg.samples_per_prompt)
        member = lowrank_rows = None
        if cfg.noise == "full":
            member = FullRankMember(params, 1, cfg.sigma, 1.0, cfg.shared_noise)
        else:
            lowrank_rows = LowRankMembers(layers, [1], [1.0], cfg.sigma, cfg.rank)
        pace = probe_pace(engine, [e.prompt for e in train_examples[:rows]], device, rows, cfg.temperature,
                     perturbation=lowrank_rows, member=member)
    pace: Pace = dist.from_main(pace)
    return choose_preset(cfg, es_cpu_preset(env, env_id), shape,
                         lambda c: c.population * prompts(c) * c.samples_per_prompt, seconds, "iteration", pace)
