"""What the RL trainers (GRPO, PPO) share: sampling responses with their token ids, per-token
log-probs of completions in one padded forward pass, masks, KL estimators, the optimizer, RL
checkpoints and budget accounting. The algorithms themselves live in ``grpo.py`` and ``ppo.py``.

Layout of a training batch (the same as generation's): each row is a left-padded prompt followed
by a right-padded completion, so every completion starts at the same column ``P`` and the logits
that score it are the last ``T + 1`` positions of the forward pass (``logits_to_keep``)::

    [pad pad p0 p1 p2 | c0 c1 c2 pad]      position P-1+t predicts completion token t
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import llm_envs
from llm_envs import Example, TaskEnv
from trainers.config import ConfigError, check, env_kwargs, to_dict
from trainers.es import summarize
from trainers.generation import encode_prompts, generate
from trainers.models import load_model, save_model
from trainers.rollout import batch_for, evaluate
from trainers.run_dir import RunDir

# ----- masks and reductions ----------------------------------------------------------------------


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is set (pads contribute exactly 0 to the value, even NaN)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the set positions of ``mask`` (0 when none is set)."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` over the masked positions (population std); pads become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return torch.where(mask.bool(), (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


# ----- KL estimators (Schulman, "Approximating KL divergence") ------------------------------------


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0,
    unbiased for tokens sampled from the policy, exactly 0 where the two agree)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimate ``logp - ref`` (unbiased, can be negative; the usual in-reward penalty)."""
    return logp - ref_logp


KL_ESTIMATORS = {"k1": kl_k1, "k3": kl_k3}


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token policy loss ``-min(r * A, clip(r, 1 - eps, 1 + eps) * A)`` with
    ``r = exp(logp - old_logp)``, and where the clip is active (for the clip fraction)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


# ----- sampling ---------------------------------------------------------------------------------


@dataclass
class Samples:
    """``len(examples) * group_size`` responses, prompt-major: the responses to prompt ``i`` are rows
    ``i * G : (i + 1) * G``. Token ids are exactly what the model conditioned on and produced (a
    completion ends with its stop token when it stopped)."""

    examples: list[Example]  # one per response
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    texts: list[str]
    rewards: torch.Tensor  # [B] float32
    correct: torch.Tensor  # [B] bool
    group_size: int

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


def sample(model, tokenizer, env: TaskEnv, examples: Sequence[Example], group_size: int, max_new_tokens: int,
           batch_size: int = 32, temperature: float = 1.0, seed: int | None = None,
           score_workers: int | None = None) -> Samples:
    """Sample ``group_size`` completions per example (the shared ``generate``) and score them (the
    env's ``score_batch``, completions only, as every trainer does)."""
    prompts = [e.prompt for e in examples]
    with compute_context(model):
        out = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                       temperature=temperature, seed=seed, num_return_sequences=group_size)
    per_response = [e for e in examples for _ in range(group_size)]
    prompt_ids = [ids for ids in encode_prompts(tokenizer, prompts) for _ in range(group_size)]
    scores = env.score_batch(out.texts, per_response, workers=score_workers)
    return Samples(per_response, prompt_ids, out.token_ids, out.texts,
                   torch.tensor([s.reward for s in scores], dtype=torch.float32),
                   torch.tensor([bool(s.correct) for s in scores]), group_size)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step (independent of every other step's, reproducible on resume)."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


# ----- the forward pass -------------------------------------------------------------------------


@dataclass
class Padded:
    """Token tensors of a batch of (prompt, completion) pairs, in the layout above."""

    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    position_ids: torch.Tensor  # [B, P + T]
    completion_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float: 1 on completion tokens, 0 on padding
    prompt_width: int  # P

    @property
    def width(self) -> int:  # T
        return self.completion_ids.shape[1]


def pad(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
        device: torch.device | str = "cpu") -> Padded:
    """Left-pad the prompts and right-pad the completions into one batch."""
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    B = len(prompt_ids)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        input_ids[i, P:P + len(c)] = torch.tensor(c, dtype=torch.long)
        attention[i, P - len(p):P + len(c)] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    mask = attention[:, P:].float()
    return Padded(input_ids.to(device), attention.to(device), position_ids.to(device),
                  input_ids[:, P:].to(device), mask.to(device), P)


def token_logprobs(model, batch: Padded, temperature: float = 1.0, hidden: bool = False):
    """Per-token log-probs ``[B, T]`` of the completion tokens under ``model`` (at the sampling
    ``temperature``), from one forward pass; with ``hidden=True`` also the last hidden states
    ``[B, T, H]`` at the same positions (the states a value head reads). Pads hold garbage:
    always reduce with ``batch.mask``."""
    T, P = batch.width, batch.prompt_width
    with compute_context(model):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, logits_to_keep=T + 1, use_cache=False,
                    output_hidden_states=hidden)
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    ids = batch.completion_ids.unsqueeze(-1)
    logp = logits.gather(-1, ids).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if hidden:
        return logp, out.hidden_states[-1][:, P - 1:P + T - 1, :]
    return logp


def micro_batches(n: int, count: int) -> list[slice]:
    """``count`` contiguous, near-equal slices of ``range(n)`` (gradient accumulation)."""
    bounds = np.linspace(0, n, min(count, n) + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def compute_context(model):
    """bf16 autocast on CUDA (the weights stay fp32: AdamW steps of 1e-6 vanish in bf16 weights);
    nothing on CPU."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ----- models and optimizer ---------------------------------------------------------------------


def load_policy(name_or_path: str, device: str | None = None, gradient_checkpointing: bool = False):
    """The trainable policy: fp32 master weights (bf16 compute on CUDA through ``compute_context``)."""
    model, tokenizer = load_model(name_or_path, device=device, dtype=torch.float32)
    model.requires_grad_(True)
    if gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # the name in recent transformers
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    return model, tokenizer


def load_reference(name_or_path: str, device: str | None = None):
    """A frozen copy of the base model (the KL anchor); load it only when beta > 0."""
    model, _ = load_model(name_or_path, device=device, dtype=torch.float32)
    model.requires_grad_(False)
    model.eval()
    return model


def make_optimizer(groups: list[dict[str, Any]], lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over parameter groups (``{"params": [...], "lr": optional}``)."""
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)


def clip_and_step(params: list[torch.nn.Parameter], optimizer, max_grad_norm: float | None) -> float:
    """Clip the gradient norm (when ``max_grad_norm``), step, zero the gradients; returns the norm
    before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


# ----- budget -----------------------------------------------------------------------------------


@dataclass
class Budget:
    """Cumulative generated responses (``samples``, the paper's sample evaluations) and tokens, and
    the optional cap ``max_samples`` that a run never exceeds."""

    max_samples: int | None = None
    samples: int = 0
    tokens: int = 0

    def allows(self, responses: int) -> bool:
        return self.max_samples is None or self.samples + responses <= self.max_samples

    def add(self, responses: int, tokens: int) -> None:
        self.samples += int(responses)
        self.tokens += int(tokens)


# ----- checkpoints ------------------------------------------------------------------------------

TRAINER_FILE = "trainer.pt"  # optimizer, RNG and extra module states, next to the HF weights


def save_checkpoint(run: RunDir, model, tokenizer, step: int, state: dict[str, Any], optimizer,
                    modules: dict[str, torch.nn.Module] | None = None, keep: int = 2) -> None:
    """Weights (Hugging Face format) + JSON ``state`` through the run directory, then the optimizer,
    RNG and ``modules`` (e.g. a value head) in ``trainer.pt``. A checkpoint without ``trainer.pt``
    (killed in between) is skipped on resume, and ``keep >= 2`` leaves the previous one."""
    if not run.is_main:
        return
    run.save_checkpoint(model, tokenizer, step, state, keep=max(2, keep))
    blob = {"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "modules": {k: m.state_dict() for k, m in (modules or {}).items()}}
    path = run.checkpoint_dir(step) / TRAINER_FILE
    torch.save(blob, path.with_name(TRAINER_FILE + ".tmp"))
    os.replace(path.with_name(TRAINER_FILE + ".tmp"), path)


def latest_checkpoint(run: RunDir) -> tuple[int, dict[str, Any]] | None:
    """(step, JSON state) of the newest complete RL checkpoint, or ``None``."""
    for step in reversed(run.checkpoints()):
        d = run.checkpoint_dir(step)
        if (d / TRAINER_FILE).is_file():
            return step, json.loads((d / "trainer_state.json").read_text())
    return None


def restore_trainer(run: RunDir, step: int, optimizer, modules: dict[str, torch.nn.Module] | None = None) -> None:
    """Load the optimizer, RNG and module states saved with checkpoint ``step``."""
    blob = torch.load(run.checkpoint_dir(step) / TRAINER_FILE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    for k, m in (modules or {}).items():
        m.load_state_dict(blob["modules"][k])
    torch.set_rng_state(blob["torch_rng"])
    if blob["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])


# ----- the config and the run, shared by GRPO and PPO --------------------------------------------


@dataclass
class RLConfig:
    """Options every RL trainer has (names as in ``trainers.es`` where they mean the same)."""

    env: str = field(default="Countdown-v0", metadata={"help": "environment id; 'my_module:My-v0' imports my_module first"})
    model: str = field(default="smollm2-135m", metadata={"help": "Hugging Face id, local directory, or smollm2-135m"})
    steps: int = field(default=500, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=8, metadata={"help": "training prompts per sampled batch"})
    group_size: int = field(default=1, metadata={"help": "sampled responses per prompt"})
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate"})
    beta: float | None = field(default=None, metadata={"help": "KL penalty coefficient to the frozen base model (0: no reference model is loaded)"})
    clip_eps: float = field(default=0.2, metadata={"help": "clip range of the importance ratio, [1-eps, 1+eps]"})
    epochs: int = field(default=1, metadata={"help": "optimizer steps on each sampled batch (> 1 makes the clipped ratio bite)"})
    grad_accum: int = field(default=1, metadata={"help": "split each step's responses into K micro-batches (gradient accumulation)"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations in the backward pass (less memory)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient norm (0: no clipping)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of training responses"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "generation budget (default: the env's)"})
    gen_batch_size: int = field(default=32, metadata={"help": "sequences per generate() call"})
    max_samples: int | None = field(default=None, metadata={"help": "stop before the generated training responses would exceed this budget"})
    seed: int = field(default=0, metadata={"help": "run seed: batches and sampling derive from it"})
    out: str | None = field(default=None, metadata={"help": "run directory (default runs/ALGO-ENV-TIME)"})
    resume: str | None = field(default=None, metadata={"help": "continue the run in this directory from its latest checkpoint (weights, optimizer, RNG, step)"})
    eval_every: int = field(default=10, metadata={"help": "held-out pass@1 every K steps (0: only start and end)"})
    eval_split: str = field(default="test", metadata={"help": "split for held-out evaluation"})
    eval_limit: int | None = field(default=None, metadata={"help": "evaluate on the first K held-out examples only"})
    checkpoint_every: int = field(default=50, metadata={"help": "save weights + optimizer every K steps"})
    env_args: str | None = field(default=None, metadata={"help": "JSON object of environment options, e.g. '{\"train_size\": 50}'"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda (default: cuda if available)"})
    score_workers: int | None = field(default=None, metadata={"help": "scoring processes (0: score in-process)"})

    def validate(self) -> None:
        try:
            llm_envs.registry.resolve_id(self.env)
        except llm_envs.UnknownEnvError as exc:
            raise ConfigError(f"--env: {exc}") from None
        check(self.steps >= 0, "steps", "must be >= 0")
        check(self.batch_size >= 1, "batch_size", "must be >= 1")
        check(self.group_size >= 1, "group_size", "must be >= 1")
        check(self.lr > 0 and math.isfinite(self.lr), "lr", "must be a positive number")
        check(self.beta is None or (self.beta >= 0 and math.isfinite(self.beta)), "beta", "must be >= 0")
        check(0 < self.clip_eps < 1, "clip_eps", "must be in (0, 1)")
        check(self.epochs >= 1, "epochs", "must be >= 1")
        check(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        check(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        check(self.temperature > 0 and math.isfinite(self.temperature), "temperature", "must be > 0 (RL samples)")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        check(self.gen_batch_size >= 1, "gen_batch_size", "must be >= 1")
        check(self.max_samples is None or self.max_samples >= 1, "max_samples", "must be >= 1")
        check(self.eval_every >= 0 and self.checkpoint_every >= 1, "eval_every", "eval_every >= 0, checkpoint_every >= 1")
        env_kwargs(self.env_args)  # validates: a JSON object or nothing


def train(cfg: RLConfig, algorithm) -> Path:
    """The RL run, for any ``algorithm`` (GRPO, PPO): sample a batch, ``algorithm.prepare`` it (no
    gradients: reference log-probs, advantages, ...), ``algorithm.update`` it ``epochs`` times (one
    optimizer step each); log, evaluate, checkpoint; save the final model."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("the RL trainers run in one process (launch them without accelerate/torchrun)")
    run = RunDir(cfg.out, resume=cfg.resume is not None)
    run.write_config(to_dict(cfg))
    env = llm_envs.make(cfg.env, **env_kwargs(cfg.env_args))
    cfg.max_new_tokens = cfg.max_new_tokens or env.max_new_tokens
    train_examples = env.examples("train")
    say = tqdm.write

    # Resume: the newest complete checkpoint (weights, optimizer, RNG, step, budget).
    ckpt = latest_checkpoint(run) if cfg.resume else None
    done, state = ckpt if ckpt else (0, {})
    model, tokenizer = load_policy(str(run.checkpoint_dir(done)) if ckpt else cfg.model, cfg.device,
                                   cfg.gradient_checkpointing)
    ref = load_reference(cfg.model, cfg.device) if cfg.beta else None
    algo = algorithm(cfg, model, tokenizer, ref)
    optimizer = make_optimizer(algo.param_groups(), cfg.lr, cfg.weight_decay)
    budget = Budget(cfg.max_samples, state.get("samples", 0), state.get("tokens", 0))
    if cfg.resume:
        if ckpt:
            restore_trainer(run, done, optimizer, algo.modules)
        run.truncate_log(done if ckpt else -1)
        say(f"resumed {run.path} after step {done} ({'checkpoint' if ckpt else 'no checkpoint: from the start'})")

    n_params = sum(p.numel() for g in algo.param_groups() for p in g["params"])
    say(f"{algo.name} on {cfg.env}: {n_params / 1e6:.1f}M trainable parameters, {min(cfg.batch_size, len(train_examples))} "
        f"prompts x {cfg.group_size} responses per batch, lr={cfg.lr}, beta={cfg.beta}, run dir {run.path}")

    evaluated = set()

    def held_out(step: int) -> None:
        evaluated.add(step)
        scores = evaluate(model, tokenizer, env, cfg.eval_split, cfg.max_new_tokens, cfg.gen_batch_size,
                          cfg.eval_limit, cfg.score_workers)
        run.log({"iteration": step, "eval_pass@1": scores["pass@1"], "eval_reward": scores["reward"]}, step)
        say(f"[step {step}] held-out {cfg.eval_split}: pass@1 {scores['pass@1']:.3f}, reward {scores['reward']:.4f}")

    if done == 0:
        held_out(0)
    step, buffer, used = done, None, cfg.epochs
    bar = tqdm(range(done + 1, cfg.steps + 1), initial=done, total=cfg.steps, desc=algo.name, dynamic_ncols=True)
    for step in bar:
        start = time.perf_counter()
        if used == cfg.epochs:  # a fresh batch of responses
            prompts = batch_for(train_examples, cfg.batch_size, cfg.seed, step)
            if not budget.allows(len(prompts) * cfg.group_size):
                say(f"--max-samples {cfg.max_samples} reached after {budget.samples} responses: stopping at step {step - 1}")
                step -= 1
                break
            samples = sample(model, tokenizer, env, prompts, cfg.group_size, cfg.max_new_tokens, cfg.gen_batch_size,
                             cfg.temperature, step_seed(cfg.seed, step), cfg.score_workers)
            budget.add(len(samples), samples.num_tokens)
            buffer, used = algo.prepare(samples), 0
        stats = algo.update(buffer, optimizer)
        used += 1
        r = samples.rewards
        record = {"iteration": step, "reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
                  "reward_min": float(r.min()), "reward_max": float(r.max()),
                  "accuracy": float(samples.correct.float().mean()),
                  "response_length": samples.num_tokens / len(samples), **stats,
                  "seconds": time.perf_counter() - start, "samples": budget.samples, "tokens": budget.tokens}
        run.log(record, step)
        if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
            held_out(step)
        if step % cfg.checkpoint_every == 0:
            save_checkpoint(run, model, tokenizer, step, {"iteration": step, "samples": budget.samples,
                                                          "tokens": budget.tokens}, optimizer, algo.modules)
        bar.set_postfix(reward=f"{record['reward_mean']:.4f}", loss=f"{record['loss']:.4f}")
    bar.close()
    if step > done and step not in evaluated:
        held_out(step)
    save_model(model, tokenizer, run.path / "final")
    summarize(run)
    run.close()
    env.close()
    return run.path
