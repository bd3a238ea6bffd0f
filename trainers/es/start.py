"""What an ES run says when it starts: one line naming the run (what is perturbed, precision,
noise, population, engine), and warnings about settings that lose part of what the user asked."""

from __future__ import annotations

from trainers.common import adapters
from trainers.common.precision import Decision
from trainers.es.noise import fullrank, lowrank

#: Below this sigma a full-rank member cast to bf16 loses a noticeable part of its perturbation
#: (``benchmarks.speed.perturbation_cast``: correlation 0.93 at 1e-3, 0.81 at 5e-4 on SmolLM2): ES warns.
BF16_FULL_RANK_SIGMA = 1e-3


def start_lines(cfg, model, params: fullrank.Params, layers: list[lowrank.Layer] | None, decision: Decision,
                engine: str, run_dir, world: int, per_iteration: int) -> list[str]:
    """The start line of an ES run, then its warnings."""
    mode = f"low-rank R={cfg.rank} noise on {len(layers)} linear layers" if layers else "full-rank noise"
    if cfg.lora:
        mode = f"{adapters.start_text(model)}, full-rank noise on every factor, the population in one batched generation"
    decoding = "greedy members" if cfg.temperature == 0 else (
        f"members sampled at temperature {cfg.temperature:g}{f', top-p {cfg.top_p:g}' if cfg.top_p < 1 else ''}, "
        f"{cfg.samples_per_prompt} per prompt")
    mode += f", {world} processes" if world > 1 else ""
    share = params.numel() / sum(p.numel() for p in model.parameters())
    masters = any(m is not None for m in params.masters)
    precision = f"{decision.line()}" + (" with fp32 masters" if masters else "")
    lines = [f"ES on {cfg.env}: {params.numel() / 1e6:.1f}M parameters perturbed ({share:.1%} of the model; "
             f"{mode}), N={cfg.population}, sigma={cfg.sigma}, alpha={cfg.alpha}, {per_iteration} prompts/iteration, "
             f"{decoding}, engine {engine}, dtype {precision}, run dir {run_dir}"]
    if not layers and cfg.sigma < BF16_FULL_RANK_SIGMA and masters:
        lines.append(f"warning: full-rank members in {cfg.dtype} at sigma {cfg.sigma:g}: the cast to {cfg.dtype} rounds "
                     f"away part of each member's perturbation (SmolLM2 at 5e-4: the realised one correlates 0.81 with "
                     f"the intended, docs/es.md); --dtype fp32 keeps all of it")
    if layers and not cfg.lora and cfg.param_filter is None and share < lowrank.SMALL_SHARE:
        lines.append(f"warning: low-rank noise perturbs only {share:.1%} of this model's parameters: it perturbs "
                     f"nn.Linear / Conv1D weights, and the rest (fused 3-D MoE experts, embeddings, ...) keeps its base "
                     f"values; --noise full perturbs every parameter")
    return lines
