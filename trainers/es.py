"""Evolution Strategies fine-tuning of an LLM (Qiu et al., "Evolution Strategies at Scale",
Algorithm 2), on any llm_envs environment.

Each iteration: draw N seeds; for each, perturb the weights in place by sigma * eps(seed),
generate greedy completions for the training batch, score them (mean reward R_n), restore the
weights exactly; z-score the rewards; then theta += alpha / N * sum_n Z_n * eps(seed_n), tensor
by tensor (1/sigma is folded into alpha, as in the paper).

    python -m trainers.es --env Sudoku-v0
    python -m trainers.es --config benchmarks/configs/es_conciseness_cpu.yaml
    python -m trainers.es --resume runs/es-Sudoku-v0-...      # continue a killed run
    accelerate launch --num_processes 2 -m trainers.es ...    # seeds split across processes
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import llm_envs
from trainers import distributed, noise
from trainers.config import ConfigError, TrainConfig, check, env_kwargs, resolve_config, run_main, to_dict
from trainers.models import load_model, save_model
from trainers.rollout import batch_for, evaluate, rollout
from trainers.run_dir import RunDir, read_jsonl, summarize

# The paper's hyperparameters per environment (PAPER_NOTES.md); flags override them.
PAPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "Countdown-v0": dict(population=30, sigma=1e-3, alpha=5e-4, iterations=500),
    "Conciseness-v0": dict(population=30, sigma=1e-3, alpha=5e-4, iterations=1000),
    "MATH-v0": dict(population=30, sigma=1e-3, alpha=5e-4, iterations=300),
    "Sudoku-v0": dict(population=32, sigma=1e-3, alpha=5e-4, iterations=2500),
    "ARC-AGI-v0": dict(population=50, sigma=1e-3, alpha=3e-4, iterations=1500),
}
GENERIC_DEFAULTS = dict(population=30, sigma=1e-3, alpha=5e-4, iterations=500)


@dataclass
class ESConfig(TrainConfig):
    iterations: int | None = field(default=None, metadata={"help": "ES iterations (paper's per env)"})
    population: int | None = field(default=None, metadata={"help": "N, perturbations per iteration (paper's per env)"})
    sigma: float | None = field(default=None, metadata={"help": "noise scale (paper's per env)"})
    alpha: float | None = field(default=None, metadata={"help": "learning rate, 1/sigma folded in (paper's per env)"})
    batch_size: int | None = field(default=None, metadata={"help": "training prompts per iteration (default: whole train split)"})
    mirrored: bool = field(default=False, metadata={"help": "antithetic pairs (+eps, -eps) (not in the paper)"})
    rank_shaping: bool = field(default=False, metadata={"help": "centered-rank rewards instead of z-scores (not in the paper)"})
    param_filter: str | None = field(default=None, metadata={"help": "regex: perturb/update only matching parameter names"})
    shared_noise: bool = field(default=False, metadata={"help": "the paper's code's noise: same seed for every tensor"})
    dtype: str | None = field(default=None, metadata={"help": "fp32 / bf16 weights (default: fp32 on CPU, bf16 on CUDA; "
                                                               "fp32 keeps updates smaller than bf16's step)"})

    def validate(self) -> None:
        super().validate()
        defaults = PAPER_DEFAULTS.get(llm_envs.registry.resolve_id(self.env), GENERIC_DEFAULTS)
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        check(self.iterations >= 0, "iterations", "must be >= 0")
        check(self.population >= 2, "population", "must be >= 2 (z-scores need two rewards)")
        check(not self.mirrored or self.population % 2 == 0, "population", "must be even with --mirrored")
        check(self.sigma > 0 and np.isfinite(self.sigma), "sigma", "must be a positive number")
        check(self.alpha > 0 and np.isfinite(self.alpha), "alpha", "must be a positive number")
        check(self.batch_size is None or self.batch_size >= 1, "batch_size", "must be >= 1")
        if self.param_filter is not None:
            try:
                re.compile(self.param_filter)
            except re.error as exc:
                raise ConfigError(f"--param-filter: invalid regex ({exc})") from None


# ----- the algorithm ----------------------------------------------------------------------------


def population(cfg: ESConfig, iteration: int) -> tuple[list[int], list[float]]:
    """Seeds and signs of the N members of ``iteration`` (pairs share a seed when mirrored)."""
    if cfg.mirrored:
        seeds = [noise.member_seed(cfg.seed, iteration, n // 2) for n in range(cfg.population)]
        return seeds, [1.0 if n % 2 == 0 else -1.0 for n in range(cfg.population)]
    return [noise.member_seed(cfg.seed, iteration, n) for n in range(cfg.population)], [1.0] * cfg.population


def normalise(rewards: np.ndarray, rank_shaping: bool = False) -> np.ndarray | None:
    """Z-scores of ``rewards`` (or centered ranks in [-0.5, 0.5]); ``None`` when all are equal."""
    if rewards.std() < 1e-12:
        return None
    if rank_shaping:
        ranks = np.empty(len(rewards))
        ranks[np.argsort(rewards, kind="stable")] = np.arange(len(rewards))
        return ranks / (len(rewards) - 1) - 0.5
    return (rewards - rewards.mean()) / rewards.std()


def update_coefficients(seeds: list[int], signs: list[float], z: np.ndarray, alpha: float) -> tuple[list[int], list[float]]:
    """theta += alpha/N * sum_n Z_n * sign_n * eps(seed_n), merged per distinct seed."""
    merged: dict[int, float] = {}
    for seed, sign, zn in zip(seeds, signs, z):
        merged[seed] = merged.get(seed, 0.0) + alpha / len(seeds) * sign * float(zn)
    return list(merged), list(merged.values())


def es_iteration(cfg: ESConfig, iteration: int, model, tokenizer, scorer, params, batch, rank: int = 0, world: int = 1):
    """Evaluate this process's share of the population; returns per-member arrays (zeros elsewhere)."""
    seeds, signs = population(cfg, iteration)
    rewards, accuracy, tokens = (np.zeros(cfg.population) for _ in range(3))
    for n in range(rank, cfg.population, world):
        patches = noise.perturb(params, seeds[n], cfg.sigma, signs[n], cfg.shared_noise)
        try:
            r = rollout(model, tokenizer, scorer, batch, cfg.max_new_tokens, cfg.gen_batch_size)
        finally:
            noise.restore(params, seeds[n], cfg.sigma, patches, signs[n], cfg.shared_noise)
        rewards[n], accuracy[n], tokens[n] = r.mean_reward, r.accuracy, sum(r.num_tokens)
    return seeds, signs, rewards, accuracy, tokens


def select_params(model, pattern: str | None) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs ES perturbs, in a fixed order (tied weights once)."""
    params = [(n, p) for n, p in model.named_parameters() if pattern is None or re.search(pattern, n)]
    if not params:
        raise ConfigError(f"--param-filter {pattern!r} matches no parameter")
    return params


def release_freed_buffers() -> None:
    """Have glibc unmap freed buffers of 1 MB and more at once. By default it raises its mmap
    threshold after big frees and keeps ES's per-tensor noise buffers on the heap: that alone
    doubled the peak memory of an iteration (``benchmarks/es_speed.py``)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        pass


def replay(params, updates: list[dict[str, Any]], shared: bool) -> None:
    """Re-apply logged updates: seeds and coefficients alone rebuild the weights."""
    for u in updates:
        if not u["skipped"]:
            noise.apply_update(params, u["seeds"], u["coefficients"], shared)


# ----- the run ----------------------------------------------------------------------------------


def train(cfg: ESConfig) -> Path:
    release_freed_buffers()
    dist = distributed.init()
    run = RunDir(cfg.out, resume=cfg.resume is not None, is_main=dist.is_main)
    run.write_config(to_dict(cfg))
    env = llm_envs.make(cfg.env, **env_kwargs(cfg.env_args))
    scorer = llm_envs.BatchScorer(env, cfg.score_workers)
    cfg.max_new_tokens = cfg.max_new_tokens or env.max_new_tokens
    train_examples = env.examples("train")
    per_iteration = min(cfg.batch_size or len(train_examples), len(train_examples))
    say = tqdm.write if dist.is_main else (lambda *a, **k: None)

    # Resume: newest weight checkpoint, then replay the updates logged after it.
    updates_path = run.path / "updates.jsonl"
    updates = read_jsonl(updates_path) if cfg.resume else []
    done = updates[-1]["iteration"] if updates else 0
    ckpts = [k for k in run.checkpoints() if k <= done] if cfg.resume else []
    source = str(run.checkpoint_dir(ckpts[-1])) if ckpts else cfg.model
    with dist.main_first():  # the first load may fetch and convert the default model
        model, tokenizer = load_model(source, device=dist.device or cfg.device, dtype=cfg.dtype)
    params = select_params(model, cfg.param_filter)
    replay(params, [u for u in updates if u["iteration"] > (ckpts[-1] if ckpts else 0)], cfg.shared_noise)
    if cfg.resume and dist.is_main:
        run.truncate_log(done)
        updates_path.write_text("".join(json.dumps(u) + "\n" for u in updates))  # drop a torn line
        say(f"resumed {run.path} after iteration {done} (weights from {'checkpoint ' + str(ckpts[-1]) if ckpts else 'the base model'})")
    samples = updates[-1]["samples"] if updates else 0
    total_tokens = updates[-1].get("tokens", 0) if updates else 0

    n_params = sum(p.numel() for _, p in params)
    say(f"ES on {cfg.env}: {n_params / 1e6:.1f}M parameters perturbed, N={cfg.population}, sigma={cfg.sigma}, "
        f"alpha={cfg.alpha}, {per_iteration} prompts/iteration, run dir {run.path}")

    def held_out(iteration: int) -> dict[str, float]:
        if not dist.is_main:
            return {}
        scores = evaluate(model, tokenizer, scorer, cfg.eval_split, cfg.max_new_tokens, cfg.gen_batch_size,
                          cfg.eval_limit)
        record = {"iteration": iteration, "eval_pass@1": scores["pass@1"], "eval_reward": scores["reward"]}
        run.log(record, iteration)
        say(f"[iter {iteration}] held-out {cfg.eval_split}: pass@1 {scores['pass@1']:.3f}, reward {scores['reward']:.4f}")
        return record

    if done == 0:
        held_out(0)
    trained, last = cfg.iterations > done, done
    bar = tqdm(range(done + 1, cfg.iterations + 1), initial=done, total=cfg.iterations, disable=not dist.is_main,
               desc="ES", dynamic_ncols=True)
    for it in bar:
        start = time.perf_counter()
        batch = batch_for(train_examples, per_iteration, cfg.seed, it)
        seeds, signs, rewards, accuracy, tokens = es_iteration(cfg, it, model, tokenizer, scorer, params, batch,
                                                               dist.rank, dist.world)
        rewards, accuracy, tokens = dist.sum(rewards), dist.sum(accuracy), dist.sum(tokens)
        z = normalise(rewards, cfg.rank_shaping)
        if z is None:
            say(f"[iter {it}] all {cfg.population} rewards equal ({rewards[0]:.4f}): update skipped")
            upd_seeds, coefs = [], []
        else:
            upd_seeds, coefs = update_coefficients(seeds, signs, z, cfg.alpha)
            noise.apply_update(params, upd_seeds, coefs, cfg.shared_noise)
        samples += cfg.population * len(batch)
        total_tokens += int(tokens.sum())
        record = {"iteration": it, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
                  "reward_min": float(rewards.min()), "reward_max": float(rewards.max()),
                  "accuracy": float(accuracy.mean()), "skipped": z is None, "seconds": time.perf_counter() - start,
                  "tokens": total_tokens, "tokens_iteration": int(tokens.sum()), "samples": samples}
        run.log(record, it)
        last = it
        out_of_budget = cfg.max_samples is not None and samples >= cfg.max_samples
        if cfg.eval_every and it % cfg.eval_every == 0 and it != cfg.iterations and not out_of_budget:
            held_out(it)
        if dist.is_main:  # the update record is what resume replays: written once the iteration is whole
            with open(updates_path, "a") as f:
                f.write(json.dumps({"iteration": it, "seeds": upd_seeds, "coefficients": coefs, "skipped": z is None,
                                    "rewards": rewards.tolist(), "samples": samples, "tokens": total_tokens}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if it % cfg.checkpoint_every == 0:
                run.save_checkpoint(model, tokenizer, it, {"iteration": it})
        bar.set_postfix(reward=f"{record['reward_mean']:.4f}", sec=f"{record['seconds']:.1f}")
        if out_of_budget:
            say(f"sample budget reached: {samples} responses >= --max-samples {cfg.max_samples}")
            break
    if trained:
        held_out(last)
    if dist.is_main:
        save_model(model, tokenizer, run.path / "final")
        summarize(run)
    run.close()
    scorer.close()
    env.close()
    dist.barrier()
    return run.path


def resolve(argv: list[str] | None = None) -> ESConfig:
    """The config of a new run, or of a resumed run (its saved config, overridden by flags)."""
    return resolve_config(ESConfig, "es", argv, description=__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> None:
    run_main(resolve, train, argv)


if __name__ == "__main__":
    main()
