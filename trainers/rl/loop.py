"""The RL run shared by GRPO and PPO: its options (``RLConfig``) and its loop (``train``).

Each step samples a batch of responses (``trainers.rl.sampling``), lets the algorithm turn it into
a loss and optimizer steps (``grpo.py``, ``ppo.py``), and logs, evaluates and checkpoints like
every trainer (the same run directory, held-out pass@1 and sample budget as ES).

On W processes (``torchrun`` / ``accelerate launch``) the models are sharded with FSDP2
(``trainers.rl.sharding``): each rank samples and trains on its contiguous share of the step's
prompts, the losses are divided by the whole step's normalisers, and W ranks take one process's
optimizer step on the same batch; rank 0 alone logs and writes files.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import llm_envs
from trainers.common import adapters, distributed
from trainers.common.budget import Budget
from trainers.common.config import ConfigError, TrainConfig, check, settle_runtime, to_dict
from trainers.common.episodes import EpisodeTally, check_command, cut_short
from trainers.common.held_out import HeldOut
from trainers.common.models import compute_dtype, resolve_device
from trainers.common.progress import RunClock, bar, evaluations_left, options
from trainers.common.rollout import batch_for, eval_examples
from trainers.common.run_dir import RunDir, summarize
from trainers.common.sizing import check_before_choice, prompt_ids
from trainers.common.splits import measured_split_counts, training_env
from trainers.engines import make_engine
from trainers.rl.checkpoints import (check_processes, latest_checkpoint, load_batch, restore_sharded, restore_trainer,
                                     save_checkpoint, save_final)
from trainers.rl.determinism import deterministic
from trainers.rl.policy import enable_checkpointing, load_policy, load_reference, make_optimizer
from trainers.rl.presets import family_of, rl_cpu_preset, rl_fit
from trainers.rl.sampling import response_seeds, sample
from trainers.rl.sharding import Ranks


@dataclass
class RLConfig(TrainConfig):
    """Options every RL trainer has (names as in ``trainers.es`` where they mean the same)."""

    steps: int = field(default=500, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=8, metadata={"help": "training prompts per sampled batch"})
    group_size: int = field(default=1, metadata={"help": "sampled responses per prompt"})
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate"})
    beta: float | None = field(default=None, metadata={"help": "KL penalty coefficient to the frozen base model (0: no reference model is loaded)"})
    clip_eps: float = field(default=0.2, metadata={"help": "clip range of the importance ratio, [1-eps, 1+eps]"})
    epochs: int = field(default=1, metadata={"help": "optimizer steps on each sampled batch (> 1 makes the clipped ratio bite)"})
    grad_accum: int = field(default=1, metadata={"help": "split each step's responses into K micro-batches (gradient "
                                                         "accumulation; whole groups with the shared prefix)"})
    micro_batch_tokens: int | None = field(default=None, metadata={
        "help": "split each step into as few micro-batches as hold at most N tokens each, as the forward pass sees "
                "them (a shared prompt once), instead of --grad-accum's K parts"})
    shared_prefix: str = field(default="auto", metadata={
        "help": "compute each group's prompt once (policy, old and reference log-probs, critic), the same gradients: "
                "auto = on when groups have 2+ responses and --gradient-checkpointing is off (transformers drops the "
                "cache it uses under checkpointing); off = one row per response", "choices": ["auto", "on", "off"]})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations in the backward pass (less memory)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient norm (0: no clipping)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of training responses"})
    deterministic: bool = field(default=False, metadata={
        "help": "torch's deterministic algorithms, for a run that repeats bitwise on a GPU, whose kernels (e.g. "
                "index_select's backward) add with atomics in an order that changes from run to run; on a CPU RL "
                "runs repeat bitwise without it (docs/reliability.md)"})

    def validate(self) -> None:
        super().validate()
        check(self.steps >= 0, "steps", "must be >= 0")
        check(self.batch_size >= 1, "batch_size", "must be >= 1")
        check(self.group_size >= 1, "group_size", "must be >= 1")
        check(self.lr > 0 and math.isfinite(self.lr), "lr", "must be a positive number")
        check(self.beta is None or (self.beta >= 0 and math.isfinite(self.beta)), "beta", "must be >= 0")
        check(0 < self.clip_eps < 1, "clip_eps", "must be in (0, 1)")
        check(self.epochs >= 1, "epochs", "must be >= 1")
        check(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        check(self.micro_batch_tokens is None or self.micro_batch_tokens >= 1, "micro_batch_tokens", "must be >= 1")
        check(self.micro_batch_tokens is None or self.grad_accum == 1, "micro_batch_tokens",
              "give --grad-accum K or --micro-batch-tokens N, not both")
        check(not (self.shared_prefix == "on" and self.group_size < 2), "shared_prefix",
              "'on' needs --group-size >= 2 (responses that share a prompt)")
        check(not (self.shared_prefix == "on" and self.gradient_checkpointing), "shared_prefix",
              "'on' does not work with --gradient-checkpointing (transformers drops the key/value cache the shared "
              "prefix reads); use --shared-prefix off, or leave checkpointing off")
        check(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        check(self.temperature > 0 and math.isfinite(self.temperature), "temperature", "must be > 0 (RL samples)")


def uses_shared_prefix(cfg: RLConfig) -> bool:
    """Whether the run computes each group's prompt once (``--shared-prefix``)."""
    if cfg.shared_prefix == "auto":
        return cfg.group_size > 1 and not cfg.gradient_checkpointing
    return cfg.shared_prefix == "on"


def rl_clock(cfg: RLConfig, say, device: str, left: int, prompts: int, eval_rows: int, evals: int,
             whole_calls: bool) -> RunClock:
    """The projection of this run's time on ``device``: ``left`` steps of ``prompts`` x
    ``group_size`` responses, and ``evals`` held-out evaluations (``whole_calls``: the engine
    reports finished rows only)."""
    shorten = options(f"--batch-size (prompts per step, now {prompts})",
                      f"--group-size (responses per prompt, now {cfg.group_size})",
                      f"--max-new-tokens (now {cfg.max_new_tokens})", *["a GPU"] * (device == "cpu"))
    return RunClock(say, "step", left, prompts * cfg.group_size, f"{prompts} prompts x {cfg.group_size} responses",
                    shorten, device, cfg.max_new_tokens, eval_rows, evals, whole_calls,
                    also="the update (log-probs, backward pass, optimizer step)")


def check_batch(cfg: RLConfig, ranks: Ranks, train_size: int) -> None:
    """A sampled batch larger than ``--max-samples``, or too small for every process's
    ``--grad-accum`` micro-batches, is a ``ConfigError``."""
    prompts_per_step = min(cfg.batch_size, train_size)
    per_step = prompts_per_step * cfg.group_size  # responses one sampled batch generates (all ranks)
    if cfg.max_samples is not None and cfg.max_samples < per_step:
        raise ConfigError(f"--max-samples {cfg.max_samples} is less than one sampled batch: "
                          f"{per_step // cfg.group_size} prompts x {cfg.group_size} responses = {per_step}")
    units = (prompts_per_step // ranks.world) * (1 if uses_shared_prefix(cfg) else cfg.group_size)
    if ranks.sharded and units < cfg.grad_accum:
        raise ConfigError(f"--batch-size {prompts_per_step} prompts over {ranks.world} processes leaves a process "
                          f"{prompts_per_step // ranks.world} prompts x {cfg.group_size} responses, fewer than "
                          f"--grad-accum {cfg.grad_accum} micro-batches: every process needs at least one "
                          f"{'group' if uses_shared_prefix(cfg) else 'response'} per micro-batch")


def train(cfg: RLConfig, algorithm) -> Path:
    """The RL run, for any ``algorithm`` (GRPO, PPO), under ``--deterministic``: see ``run_rl``."""
    with deterministic() if cfg.deterministic else contextlib.nullcontext():
        return run_rl(cfg, algorithm)


def run_rl(cfg: RLConfig, algorithm) -> Path:
    """The RL run: sample a batch, ``algorithm.prepare`` it (no gradients: reference log-probs,
    advantages, ...), ``algorithm.update`` it ``epochs`` times (one optimizer step each); log,
    evaluate, checkpoint; save the final model."""
    ranks = Ranks(distributed.init())
    env = training_env(cfg)  # bad options end here, before any run directory exists
    cfg.max_new_tokens = cfg.max_new_tokens or env.max_new_tokens
    try:
        dev = resolve_device(ranks.dist.device or cfg.device)
    except ValueError as exc:
        raise ConfigError(f"--device: {exc}") from None
    # model config, compute dtype and engine, rank 0's on every rank; weights, gradients and AdamW stay fp32
    runtime = settle_runtime(cfg, dev, ranks.broadcast, ranks.is_main)
    dtype = runtime.precision.torch_dtype
    train_examples = env.examples("train")
    # a batch that fails under every preset the probe may choose ends here, before any run directory
    check_before_choice(cfg, rl_cpu_preset(env, llm_envs.registry.resolve_id(cfg.env), family_of(cfg)),
                        lambda c: check_batch(c, ranks, len(train_examples)))
    cfg.out = ranks.broadcast(cfg.out)  # the default name holds each rank's start time: rank 0's for all
    run = RunDir(cfg.out, resume=cfg.resume is not None, is_main=ranks.is_main)
    run.write_config(to_dict(cfg))
    launch = f"torchrun --nproc-per-node {ranks.world} " if ranks.sharded else ""
    ranks.dist.hint = f"continue it with: {launch}python -m trainers.{cfg.algorithm.replace('dr_', '')} --resume {run.path}"
    scorer = llm_envs.BatchScorer(env, cfg.score_workers)
    say = tqdm.write if ranks.is_main else (lambda *a, **k: None)

    # Resume: the newest complete checkpoint (weights, optimizer, RNG, step, budget).
    ckpt = latest_checkpoint(run) if cfg.resume else None
    done, state = ckpt if ckpt else (0, {})
    if ckpt:
        check_processes(run, done, state, ranks.world)
    device = ranks.dist.device or cfg.device
    # Dropout (--lora-dropout, a model's own) draws from torch's global RNG, which torch seeds at
    # random in each process: seeded from the run's seed and rank, a run repeats (a resume restores it)
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, ranks.dist.rank]).generate_state(1)[0]))
    with ranks.dist.main_first():  # the first load may fetch and convert the default model
        model, tokenizer = load_policy(str(run.checkpoint_dir(done)) if ckpt else cfg.model, device,
                                       cfg.gradient_checkpointing, dtype, cfg, cfg.seed, cfg.model,
                                       frozen_in_compute=not ranks.sharded)
    algorithm.adapt(cfg, model)  # PPO's critic adapter: part of the policy's model before copies and shards
    # Rollouts come from the engine, the loss's log-probs from the policy itself (as TRL and verl do).
    # On several processes the engine holds its own full copy, taken before the policy is sharded;
    # each model is sharded (FSDP2; nothing on one process) before the next one is loaded.
    dtype = compute_dtype(model)  # None in fp32: the weights' own
    options = runtime.engine_options(cfg)
    engine = make_engine(options, ranks.engine_model(model, options.engine, dtype), tokenizer, dtype)
    fit = rl_fit(cfg, ranks, engine, env, train_examples, dev.type, uses_shared_prefix)  # --preset, from a probe here
    check_batch(cfg, ranks, len(train_examples))
    if cfg.gradient_checkpointing:  # a preset may have turned it on after the load (ARC-AGI-v0's CPU preset)
        enable_checkpointing(model)
    prompts_per_step = min(cfg.batch_size, len(train_examples))
    per_step = prompts_per_step * cfg.group_size
    run.write_config(to_dict(cfg))  # the preset's values, and where each value came from
    ranks.shard(model)
    ref = load_reference(cfg.model, device, dtype) if cfg.beta and not cfg.lora else None
    ranks.shard(ref)
    if cfg.beta and cfg.lora:  # the KL reference: the policy's base, its adapters disabled (no second copy)
        ref = adapters.BaseOf(model)
    algo = algorithm(cfg, model, tokenizer, ref, ranks)
    ranks.shard(*algo.modules.values())  # PPO's critic
    run.note_runtime(model, done, runtime, dtype,
                     splits=measured_split_counts(env, ("train", cfg.eval_split), cfg.eval_limit))
    optimizer = make_optimizer(algo.param_groups(), cfg.lr, cfg.weight_decay)
    budget = Budget(cfg.max_samples, state.get("samples", 0), state.get("tokens", 0))
    # The prepared batch the optimizer steps are on, and how many steps have used it (epochs > 1
    # takes several steps on one batch; a checkpoint between them saves the batch, so a resumed
    # run continues on exactly the same batch, old log-probs included).
    buffer, used = None, cfg.epochs
    if cfg.resume:
        if ckpt and ranks.sharded:
            restore_sharded(run, ranks, done, model, optimizer, algo.modules)
        elif ckpt:
            restore_trainer(run, done, optimizer, algo.modules)
        if ckpt:
            saved = load_batch(run, done, next(model.parameters()).device, ranks)
            if saved is not None:
                buffer, used = saved["buffer"], saved["used"]
                samples = buffer.samples
        run.truncate_log(done if ckpt else -1)
        say(f"resumed {run.path} after step {done} ({'checkpoint' if ckpt else 'no checkpoint: from the start'})")

    n_params = sum(p.numel() for g in algo.param_groups() for p in g["params"])
    lora = f" in {adapters.start_text(model)}" if cfg.lora else ""
    say(f"{algo.name} on {cfg.env}: {n_params / 1e6:.{2 if cfg.lora else 1}f}M trainable parameters{lora} ({runtime.precision.line()} compute, "
        f"fp32 master weights and optimizer), {prompts_per_step} "
        f"prompts x {cfg.group_size} responses per batch, lr={cfg.lr}, beta={cfg.beta}, engine {engine.name} "
        f"({runtime.engine_why}), run dir {run.path}" + (f", {ranks.world} processes (FSDP)" if ranks.sharded else ""))

    left = budget.steps_left(cfg.steps - done, per_step)  # steps this invocation will run
    held = eval_examples(env, cfg.eval_split, cfg.eval_limit)[::ranks.world]  # process 0's share, the largest
    eval_rows = len(held)
    share = ranks.share(prompts_per_step)  # this rank's prompts of every step
    clock = rl_clock(cfg, say, next(model.parameters()).device.type, left, share.stop - share.start, eval_rows,
                     evaluations_left(done, done + left, cfg.eval_every), engine.finished_rows_only) \
        if ranks.is_main else None
    held_out = HeldOut(cfg, engine, scorer, run, ranks.dist, say, cfg.gen_batch_size, clock,
                       done if cfg.resume else None, unit="step")

    say(fit.line(algo.name, cfg.env, left, eval_rows, evaluations_left(done, done + left, cfg.eval_every),
                 fit.pace.evaluation(prompt_ids(engine, held), cfg.max_new_tokens, cfg.gen_batch_size)))
    if done == 0:
        held_out(0)
    step = done
    warned = False  # the first-turn warning of a multi-turn env, said once
    steps = bar(range(done + 1, cfg.steps + 1), initial=done, total=cfg.steps, desc=algo.name, unit="step", run=True,
                disable=not ranks.is_main)
    for step in steps:
        start, cpu = time.perf_counter(), time.process_time()
        ranks.dist.phase = f"step {step}"
        if used == cfg.epochs:  # a fresh batch of responses
            prompts = batch_for(train_examples, cfg.batch_size, cfg.seed, step)
            if not budget.allows(per_step):  # a run never exceeds --max-samples
                say(f"--max-samples {cfg.max_samples} reached after {budget.samples} responses: stopping at step {step - 1}")
                step -= 1
                break
            # this rank's prompts; each response's seed from (seed, step, prompt, sample) alone
            sampled = time.perf_counter()
            samples = sample(engine, scorer, prompts[share], cfg.group_size, cfg.max_new_tokens, cfg.gen_batch_size,
                             cfg.temperature, response_seeds(cfg.seed, step, range(len(prompts))[share], cfg.group_size),
                             progress=ranks.is_main and f"step {step}: sampling",
                             on_progress=clock and clock.generation)
            sampling = time.perf_counter() - sampled
            responses, tokens = ranks.sum([len(samples), samples.num_tokens])
            budget.add(int(responses), int(tokens))
            buffer, used = algo.prepare(samples), 0
        else:
            sampling = 0.0
        stats = algo.update(buffer, optimizer)
        ranks.sync_engine(engine, model, dtype)  # the next rollouts and evaluations see this step
        used += 1
        r = torch.tensor(ranks.gather(samples.rewards.tolist()), dtype=torch.float32)  # the whole batch's
        n, correct, tokens, *episode_sums = ranks.sum([len(samples), int(samples.correct.sum()), samples.num_tokens,
                                                       *(samples.episode_sums or [])])
        tally = None
        if samples.episode_sums is not None:  # a multi-turn env: its statistics, as eval names them
            tally = EpisodeTally()
            tally.sums = np.asarray(episode_sums)
        record = {"iteration": step, "reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
                  "reward_min": float(r.min()), "reward_max": float(r.max()),
                  "accuracy": float(correct / n), "response_length": float(tokens / n), **stats,
                  "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                  "sampling_seconds": sampling, "samples": budget.samples, "tokens": budget.tokens,
                  **(tally.means() if tally is not None else {})}
        run.log(record, step)
        warning = tally is not None and not warned and cut_short(tally, cfg.max_new_tokens, env.stop_strings,
                                                                   check_command(cfg.env, cfg.env_args, cfg.model,
                                                                                 cfg.max_new_tokens))
        if warning:
            say(f"[step {step}] {warning}")
            warned = True
        if clock:
            clock.trained(record["seconds"], 1.0, "step")
        if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
            held_out(step)
        if step % cfg.checkpoint_every == 0:
            save_checkpoint(run, model, tokenizer, step, {"iteration": step, "samples": budget.samples,
                                                          "tokens": budget.tokens}, optimizer, algo.modules,
                            batch={"buffer": buffer, "used": used} if used < cfg.epochs else None, ranks=ranks)
        steps.set_postfix(reward=f"{record['reward_mean']:.4f}", loss=f"{record['loss']:.4f}")
    steps.close()
    if step not in held_out.evaluated:  # also after a kill during the final evaluation: the final model is measured
        held_out(step)
    ranks.dist.phase = "the final save"
    save_final(ranks, model, tokenizer, run.path / "final")
    if ranks.is_main:
        summarize(run)
    run.close()
    engine.close()
    scorer.close()
    env.close()
    return run.path
