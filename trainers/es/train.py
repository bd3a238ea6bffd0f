"""Evolution Strategies fine-tuning of an LLM (Qiu et al., "Evolution Strategies at Scale",
Algorithm 2), on any llm_envs environment.

Each iteration: draw N seeds; for each, perturb the weights in place by sigma * eps(seed),
generate greedy completions for the training batch, score them (mean reward R_n), restore the
weights exactly; z-score the rewards; then theta += alpha / N * sum_n Z_n * eps(seed_n), tensor
by tensor (1/sigma is folded into alpha, as in the paper).

``--noise lowrank`` (EGGROLL) replaces eps_n by E_n = A_n B_n^T / sqrt(R) on every linear layer:
the weights are never touched during evaluation, and all N members generate in ONE batched call,
each on its own rows (``trainers/es/noise/lowrank.py``). Same z-scores, same alpha and sigma.

``--lora-rank R`` trains LoRA adapters instead of the weights: members perturb every adapter factor
(fp32) with Gaussian noise and the whole population generates in one batched call, member n's
adapter on its own rows (``trainers/es/noise/adapters.py``); the update and the seeds are the
full-rank ones, on the adapter factors only.

``--temperature T > 0`` measures members on sampled responses instead of greedy ones (the paper's
future work): ``--samples-per-prompt K`` responses per prompt, a member's fitness the mean over
them. Every member draws with the same sample seeds, derived from (run seed, iteration, prompt,
sample), so members are compared on common random numbers and mirrored pairs share them.

    python -m trainers.es --env Sudoku-v0
    python -m trainers.es --config benchmarks/configs/es_conciseness_cpu.yaml
    python -m trainers.es --env Countdown-v0 --noise lowrank --rank 1 --population 64
    python -m trainers.es --env Countdown-v0 --lora-rank 8 --sigma 0.01 --alpha 0.005 --population 32
    python -m trainers.es --resume runs/es-Sudoku-v0-...      # continue a killed run
    torchrun --nproc-per-node 2 -m trainers.es ...            # members split across processes
    accelerate launch --num_processes 2 -m trainers.es ...    # the same

Several processes (any engine, either noise mode): process r evaluates members r, r + P, ...
(full-rank: one by one; low-rank: all of its members in one batched call), the N rewards are
all-reduced, and every process applies the same update from the seeds, so they hold the same
weights without ever sending one; the held-out evaluation is split over them too. Every
``--check-every`` iterations and at the end they compare a checksum of their weights, and stop
with one line if one differs. On CPU (fp32, one thread per process) a run gives the same numbers
on any number of processes, and it resumes on any number (``docs/scale-out.md``: the limits).
"""

from __future__ import annotations

import ctypes
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm import tqdm

import llm_envs
from llm_envs.multiturn import is_multiturn
from trainers.common import adapters, distributed
from trainers.common.config import ConfigError, TrainConfig, check, resolve_config, run_main, settle_runtime, to_dict
from trainers.common.episodes import EpisodeTally, check_command, cut_short
from trainers.common.held_out import HeldOut
from trainers.common.models import load_model, resolve_device, save_model
from trainers.common.progress import RunClock, bar, evaluations_left, options
from trainers.common.rollout import batch_for, eval_examples, rollout
from trainers.common.run_dir import RunDir, summarize
from trainers.common.sizing import check_before_choice, prompt_ids
from trainers.common.splits import measured_split_counts, training_env
from trainers.engines import make_engine
from trainers.engines.base import Engine
from trainers.engines.generation import encode_prompts, rows_that_fit
from trainers.es.masters import load_masters, masters_of, weights_of_record
from trainers.es.noise import adapters as adapter_noise, fullrank, lowrank
from trainers.es.noise.members import AdapterMembers, FullRankMember, LowRankMembers
from trainers.es.presets import GENERIC_DEFAULTS, PAPER_DEFAULTS, es_cpu_preset, es_fit
from trainers.es.start import start_lines
from trainers.es.update_log import UpdateLog, check_noise_device

#: Keeps members' sample seeds apart from every other use of the run seed.
SAMPLE_STREAM = 0x5A3D


@dataclass
class ESConfig(TrainConfig):
    algorithm: ClassVar[str] = "es"

    iterations: int | None = field(default=None, metadata={"help": "ES iterations (paper's per env)"})
    population: int | None = field(default=None, metadata={"help": "N, perturbations per iteration (paper's per env)"})
    sigma: float | None = field(default=None, metadata={"help": "noise scale (paper's per env)"})
    alpha: float | None = field(default=None, metadata={"help": "learning rate, 1/sigma folded in (paper's per env)"})
    batch_size: int | None = field(default=None, metadata={"help": "training prompts per iteration (default: whole train split)"})
    gen_batch_size: int | None = field(default=None, metadata={"help": "sequences per generate() call (default: 32 for "
                                                                       "full-rank members and held-out evaluation; "
                                                                       "low-rank: the whole population, split only "
                                                                       "when memory requires)"})
    mirrored: bool = field(default=False, metadata={"help": "antithetic pairs (+eps, -eps) (not in the paper)"})
    rank_shaping: bool = field(default=False, metadata={"help": "centered ranks in [-0.5, 0.5] instead of z-scores, ties "
                                                                "averaged (not in the paper; ~0.3x the z-scores' scale, "
                                                                "so alpha takes ~3.4x smaller steps)"})
    param_filter: str | None = field(default=None, metadata={"help": "regex: perturb/update only matching parameter names"})
    shared_noise: bool = field(default=False, metadata={"help": "the paper's code's noise: same seed for every tensor"})
    noise: str = field(default="full", metadata={"help": "full: the paper's Gaussian noise on every weight, members "
                                                         "evaluated one by one; lowrank: EGGROLL's A B^T/sqrt(R) on "
                                                         "linear layers, the whole population in one batched generation",
                                                 "choices": ["full", "lowrank"]})
    rank: int = field(default=1, metadata={"help": "R, the rank of --noise lowrank perturbations"})
    fp32_master: bool = field(default=True, metadata={"help": "bf16/fp16 weights: an fp32 master copy receives the "
                                                              "updates (+4 bytes/parameter), so none is rounded away"})
    temperature: float = field(default=0.0, metadata={"help": "members' decoding: 0 = greedy (the paper's); > 0 samples, "
                                                              "with the same sample seeds for every member"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling threshold of members' responses (--temperature > 0)"})
    samples_per_prompt: int = field(default=1, metadata={"help": "K, sampled responses per prompt and member; a member's "
                                                                 "fitness is the mean over its K x prompts responses"})
    check_every: int = field(default=10, metadata={"help": "several processes: every K iterations and at the end they "
                                                           "compare a checksum of their weights (and fp32 masters) and "
                                                           "stop if one differs (0: no check; one process: nothing to "
                                                           "compare)"})

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
        check(self.rank >= 1, "rank", "must be >= 1")
        check(self.temperature >= 0 and np.isfinite(self.temperature), "temperature", "must be >= 0")
        check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        check(self.samples_per_prompt >= 1, "samples_per_prompt", "must be >= 1")
        check(self.check_every >= 0, "check_every", "must be >= 0 (0: no weight check)")
        check(self.samples_per_prompt == 1 or self.temperature > 0, "samples_per_prompt",
              "needs --temperature > 0 (greedy samples of a prompt are identical)")
        check(not (self.shared_noise and self.noise == "lowrank"), "shared_noise", "applies to --noise full only")
        if self.engine == "vllm" and self.noise == "lowrank":  # its hooks run only outside compiled graphs
            check(self.vllm_eager is not False, "vllm_eager", "must be true with --noise lowrank on --engine vllm")
            self.vllm_eager = True
        if self.lora:  # the adapter factors are what ES perturbs (trainers/es/noise/adapters.py)
            check(self.noise == "full", "noise", "lowrank does not apply with --lora-rank: ES perturbs every adapter "
                  "factor (noise on a rank-R adapter already is a perturbation of W of rank <= 2R)")
            check(not self.shared_noise, "shared_noise", "applies to full-weight ES only, not with --lora-rank")
            check(self.param_filter is None, "param_filter", "not with --lora-rank: choose the adapted modules with "
                  "--lora-targets")
            check(self.lora_dropout == 0, "lora_dropout", "ES measures members without dropout (no gradients): "
                  "leave it 0 with ES")
        if self.param_filter is not None:
            try:
                re.compile(self.param_filter)
            except re.error as exc:
                raise ConfigError(f"--param-filter: invalid regex ({exc})") from None


# ----- the algorithm ----------------------------------------------------------------------------


def population(cfg: ESConfig, iteration: int) -> tuple[list[int], list[float]]:
    """Seeds and signs of the N members of ``iteration`` (pairs share a seed when mirrored)."""
    if cfg.mirrored:
        seeds = [fullrank.member_seed(cfg.seed, iteration, n // 2) for n in range(cfg.population)]
        return seeds, [1.0 if n % 2 == 0 else -1.0 for n in range(cfg.population)]
    return [fullrank.member_seed(cfg.seed, iteration, n) for n in range(cfg.population)], [1.0] * cfg.population


def sample_seeds(cfg: ESConfig, iteration: int, prompts: int) -> list[int] | None:
    """The sampling seed of each (prompt, sample) row of an iteration, prompt-major, from (run seed,
    iteration, prompt, sample): every member draws with the same ones (common random numbers);
    None when members decode greedily."""
    if cfg.temperature == 0:
        return None
    return [int(np.random.SeedSequence([cfg.seed, SAMPLE_STREAM, iteration, p, k]).generate_state(2, np.uint32)
                .view(np.uint64)[0] >> 1) for p in range(prompts) for k in range(cfg.samples_per_prompt)]


def normalise(rewards: np.ndarray, rank_shaping: bool = False) -> np.ndarray | None:
    """Z-scores of ``rewards``, or with ``rank_shaping`` centered ranks in [-0.5, 0.5] (Salimans et
    al.), tied rewards sharing their average rank; ``None`` when all rewards are equal.

    Scale: z-scores have std 1; centered ranks of N distinct rewards have std
    sqrt((N + 1) / (12 (N - 1))), ~0.30 at N=30. The same alpha therefore takes ~3.4x smaller
    steps with --rank-shaping."""
    if rewards.std() < 1e-12:
        return None
    if rank_shaping:
        return centered_ranks(rewards)
    return (rewards - rewards.mean()) / rewards.std()


def centered_ranks(rewards: np.ndarray) -> np.ndarray:
    """Ranks 0..N-1 mapped to [-0.5, 0.5]; equal rewards get the mean of the ranks they span, so
    ties (a mirrored pair scoring the same, say) contribute nothing to the update."""
    order = np.argsort(rewards, kind="stable")
    ranks = np.empty(len(rewards))
    ranks[order] = np.arange(len(rewards))
    for value in np.unique(rewards):
        tied = rewards == value
        ranks[tied] = ranks[tied].mean()
    return ranks / (len(rewards) - 1) - 0.5


def update_coefficients(seeds: list[int], signs: list[float], z: np.ndarray, alpha: float) -> tuple[list[int], list[float]]:
    """theta += alpha/N * sum_n Z_n * sign_n * eps(seed_n), merged per distinct seed."""
    merged: dict[int, float] = {}
    for seed, sign, zn in zip(seeds, signs, z):
        merged[seed] = merged.get(seed, 0.0) + alpha / len(seeds) * sign * float(zn)
    return list(merged), list(merged.values())


def es_iteration(cfg: ESConfig, iteration: int, engine: Engine, scorer, params: fullrank.Params,
                 layers: list[lowrank.Layer] | None, batch, rank: int = 0, world: int = 1,
                 clock: RunClock | None = None, tally: EpisodeTally | None = None):
    """Evaluate this process's share of the population (members rank, rank + world, ...);
    returns seeds, signs and per-member arrays of mean reward, accuracy and tokens (zeros for
    other processes' members). With a ``clock`` (the main process's), progress bars show the
    members (full-rank) or rows (low-rank) done, and the clock hears how long the first took.
    ``tally``: counts every member's episodes of a multi-turn env."""
    seeds, signs = population(cfg, iteration)
    rewards, accuracy, tokens = (np.zeros(cfg.population) for _ in range(3))
    mine = list(range(rank, cfg.population, world))
    samples = sample_seeds(cfg, iteration, len(batch))
    start = time.perf_counter()
    if cfg.noise == "lowrank" or cfg.lora:
        evaluate_batched(cfg, engine, scorer, layers, batch, [(n, seeds[n], signs[n]) for n in mine],
                         rewards, accuracy, tokens, clock, samples, params, tally)
        if clock is not None:
            clock.trained(time.perf_counter() - start, 1.0, "iteration")
        return seeds, signs, rewards, accuracy, tokens
    members = bar(mine, total=len(mine), desc=f"iteration {iteration}", unit="member", disable=clock is None)
    for k, n in enumerate(members):  # the paper's loop: the engine perturbs, generates and restores exactly
        member = FullRankMember(params, seeds[n], cfg.sigma, signs[n], cfg.shared_noise)
        r = rollout(engine, scorer, batch, cfg.max_new_tokens, cfg.gen_batch_size or 32, cfg.temperature, samples,
                    cfg.samples_per_prompt, cfg.top_p, perturbation=member, progress=clock is not None and f"member {n}",
                    on_progress=clock and clock.generation)
        rewards[n], accuracy[n], tokens[n] = r.mean_reward, r.accuracy, sum(r.num_tokens)
        if tally is not None:
            tally.add(r.episodes)
        if clock is not None:
            clock.trained(time.perf_counter() - start, (k + 1) / len(mine), "member")
    return seeds, signs, rewards, accuracy, tokens


def evaluate_batched(cfg: ESConfig, engine: Engine, scorer, layers, batch, members, rewards, accuracy, tokens,
                     clock: RunClock | None = None, samples: list[int] | None = None,
                     params: fullrank.Params | None = None, tally: EpisodeTally | None = None) -> None:
    """Low-rank mode and adapters: every (member, prompt, sample) triple is one row of one engine call, rows
    member-major; more calls only when the rows do not fit in memory (an engine that schedules
    its rows itself fits them all). ``--gen-batch-size`` caps the rows of every call: whole
    members while a member's P rows fit, else one member's rows split over calls. ``samples``: the
    sampling seed of each of a member's rows, the same for every member (None: greedy). Fills the
    per-member arrays in place, over all P rows of each member; with a ``clock``, a bar shows the
    rows done. ``params``: the adapter factors (``--lora-rank``), whose members the rows evaluate;
    ``tally`` counts the episodes of a multi-turn env. A row's memory is its prompt plus what it may
    grow by (``row_growth``: a multi-turn episode's turns and the env's replies too)."""
    batch = [e for e in batch for _ in range(cfg.samples_per_prompt)]  # a member's rows, prompt-major
    P = len(batch)
    if cfg.gen_batch_size:
        cap = cfg.gen_batch_size
    elif engine.schedules_rows:
        cap = len(members) * P
    else:
        longest = max(len(ids) for ids in encode_prompts(engine.tokenizer, [e.prompt for e in batch]))
        cap = max(1, rows_that_fit(engine.model, longest + row_growth(scorer.env, cfg.max_new_tokens)))
    rows: dict[int, list[tuple[llm_envs.Score, int]]] = {n: [] for n, _, _ in members}  # (score, tokens) per row
    done = 0  # rows generated, member-major: member done // P, its prompt done % P
    while done < len(members) * P:
        first, prompt = divmod(done, P)
        if prompt == 0 and cap >= P:  # whole members
            chunk, prompts = members[first:first + cap // P], batch
        else:  # one member's prompts over several calls
            chunk, prompts = members[first:first + 1], batch[prompt:prompt + cap]
        pop = batched_members(cfg, params, layers, [s for _, s, _ in chunk], [g for _, _, g in chunk])
        row_seeds = None if samples is None else [s for _ in chunk for s in samples[prompt:prompt + len(prompts)]]
        try:
            r = rollout(engine, scorer, [e for _ in chunk for e in prompts], cfg.max_new_tokens,
                        len(chunk) * len(prompts), cfg.temperature, row_seeds, top_p=cfg.top_p, sort=False,
                        perturbation=pop, progress=clock is not None and f"{len(chunk)} members' rows",
                        on_progress=clock and clock.generation)
        except torch.OutOfMemoryError:  # the estimate was optimistic: halve the call and retry
            if cap == 1:
                raise
            cap = max(1, cap // 2)
            torch.cuda.empty_cache()
            continue
        for k, (n, _, _) in enumerate(chunk):
            own = slice(k * len(prompts), (k + 1) * len(prompts))
            rows[n] += zip(r.scores[own], r.num_tokens[own])
        if tally is not None:
            tally.add(r.episodes)
        done += len(chunk) * len(prompts)
    for n, scored in rows.items():
        rewards[n] = np.mean([s.reward for s, _ in scored])
        accuracy[n] = np.mean([bool(s.correct) for s, _ in scored])
        tokens[n] = sum(t for _, t in scored)


def batched_members(cfg: ESConfig, params: fullrank.Params, layers, seeds: list[int],
                    signs: list[float]) -> LowRankMembers | AdapterMembers:
    """The members of one batched engine call: adapters (``--lora-rank``) or low-rank noise."""
    if cfg.lora:
        return AdapterMembers(params, layers, seeds, signs, cfg.sigma)
    return LowRankMembers(layers, seeds, signs, cfg.sigma, cfg.rank)


def with_adapters(model, cfg: ESConfig):
    """``model`` with the run's LoRA adapters (``--lora-rank``): fresh ones drawn from the run seed, or
    the ones it was loaded with (a checkpoint); the model itself without adapters."""
    if not cfg.lora or adapters.has_adapters(model):
        return model
    return adapters.attach(model, cfg, cfg.seed, cfg.model)


def row_growth(env, max_new_tokens: int) -> int:
    """Tokens a row grows by after its prompt: ``max_new_tokens``, or on a multi-turn env the
    episode's token budget (every turn and the env's replies)."""
    return env.episode_tokens(max_new_tokens) if is_multiturn(env) else max_new_tokens


def perturbable(model, cfg: ESConfig) -> tuple[fullrank.Params, list | None]:
    """What ES perturbs and updates: every parameter (full), the linear layers' weights (lowrank),
    filtered by --param-filter, or the LoRA factors (--lora-rank); with fp32 masters of bf16/fp16
    tensors."""
    if cfg.lora:  # adapter factors: fp32 already (PEFT keeps adapters in fp32), their own masters
        layers = adapter_noise.adapter_layers(model)
        return adapter_noise.params_of(layers, cfg.fp32_master), layers
    if cfg.noise == "lowrank":  # masters per tensor (Params): a model may mix fp32 and bf16 tensors
        layers = lowrank.select_layers(model, cfg.param_filter, cfg.rank)
        lowrank.check_rows(model, layers)
        return fullrank.Params([(l.name, l.weight) for l in layers], cfg.fp32_master), layers
    return fullrank.Params(select_params(model, cfg.param_filter), cfg.fp32_master), None


def update_weights(cfg: ESConfig, params: fullrank.Params, layers, seeds: list[int], coefficients: list[float]) -> None:
    """theta += sum_n coefficients[n] * (eps_n or E_n): the update of either noise mode."""
    if cfg.noise == "lowrank" and not cfg.lora:
        lowrank.apply_lowrank_update(params, layers, seeds, coefficients, cfg.rank)
    else:
        fullrank.apply_update(params, seeds, coefficients, cfg.shared_noise)


def select_params(model, pattern: str | None) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs ES perturbs, in a fixed order (tied weights once)."""
    params = [(n, p) for n, p in model.named_parameters() if pattern is None or re.search(pattern, n)]
    if not params:
        raise ConfigError(f"--param-filter {pattern!r} matches no parameter")
    return params


def release_freed_buffers() -> None:
    """Fix glibc's mmap threshold at 32 MB, the top of its dynamic range. By default glibc raises
    the threshold after each big free, so ES's tensor-sized noise buffers end up on the heap: that
    alone doubled the peak memory of an iteration. A 1 MB threshold avoided it but made every
    KV-cache allocation of generation a fresh mmap (page faults on every decode step): HF generate
    ran at 0.6x. At 32 MB the peak stays 0.48x the weights (``benchmarks/speed/es.py``) and
    generation runs at full speed."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 32 << 20)  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        pass


def replay(cfg: ESConfig, params: fullrank.Params, layers, updates: list[dict[str, Any]]) -> None:
    """Re-apply logged updates: seeds and coefficients alone rebuild the weights."""
    for u in updates:
        if not u["skipped"]:
            update_weights(cfg, params, layers, u["seeds"], u["coefficients"])


def es_clock(cfg: ESConfig, say, device: str, left: int, members: int, per_iteration: int, eval_rows: int,
             evals: int, whole_calls: bool) -> RunClock:
    """The projection of this run's time on ``device``: ``left`` iterations in which this process
    evaluates ``members`` members on ``per_iteration`` prompts, and ``evals`` held-out evaluations
    (``whole_calls``: the engine reports finished rows only)."""
    shorten = options(*["--noise lowrank (the whole population in one batched generation)"] * (cfg.noise == "full"
                                                                                              and not cfg.lora),
                      f"--batch-size (prompts per iteration, now {per_iteration})",
                      f"--max-new-tokens (now {cfg.max_new_tokens})", *["a GPU"] * (device == "cpu"))
    samples = f" x {cfg.samples_per_prompt} samples" if cfg.samples_per_prompt > 1 else ""
    return RunClock(say, "iteration", left, members * per_iteration * cfg.samples_per_prompt,
                    f"N={cfg.population} x {per_iteration} prompts{samples}", shorten, device, cfg.max_new_tokens,
                    eval_rows, evals, whole_calls)


# ----- the run ----------------------------------------------------------------------------------


def iteration_size(cfg: ESConfig, train_size: int) -> tuple[int, int]:
    """(prompts per iteration, responses one iteration generates); an iteration larger than
    ``--max-samples`` is a ``ConfigError``."""
    per_iteration = min(cfg.batch_size or train_size, train_size)
    per_step = cfg.population * per_iteration * cfg.samples_per_prompt
    if cfg.max_samples is not None and cfg.max_samples < per_step:
        samples = f" x {cfg.samples_per_prompt} samples" if cfg.samples_per_prompt > 1 else ""
        raise ConfigError(f"--max-samples {cfg.max_samples} is less than one iteration: N={cfg.population} x "
                          f"{per_iteration} prompts{samples} = {per_step} responses")
    return per_iteration, per_step


def load_weights(cfg: ESConfig, dist, log: UpdateLog, device: torch.device):
    """(model, tokenizer, params, layers) where the run stands: the base model, or on a resume the
    newest checkpoint (its fp32 masters too) with the updates logged after it re-applied."""
    with dist.main_first():  # the first load may fetch and convert the default model
        model, tokenizer = load_model(log.source(cfg.model), device=device, dtype=cfg.dtype)
    model = with_adapters(model, cfg)  # a checkpoint of an adapter run loads with its adapters
    dist.wait_for_main()  # loading takes each rank its own time: start the collectives together
    check_noise_device(log.run.path, next(model.parameters()).device, write=dist.is_main)
    params, layers = perturbable(model, cfg)
    if log.checkpoint is not None:
        load_masters(params, log.run.checkpoint_dir(log.checkpoint))
    replay(cfg, params, layers, log.to_replay)
    return model, tokenizer, params, layers


def train(cfg: ESConfig) -> Path:
    release_freed_buffers()
    dist = distributed.init()
    cfg.out = dist.from_main(cfg.out)  # the default name holds each rank's start time: rank 0's for all
    env = training_env(cfg)  # bad options end here, before any run directory exists
    cfg.max_new_tokens = cfg.max_new_tokens or env.max_new_tokens
    try:
        device = resolve_device(dist.device or cfg.device)
    except ValueError as exc:
        raise ConfigError(f"--device: {exc}") from None
    # model config, dtype and engine: rank 0 resolves, every rank gets it (a resume's other --dtype ends here)
    runtime = settle_runtime(cfg, device, dist.from_main, dist.is_main)
    train_examples = env.examples("train")
    # an iteration larger than --max-samples under every preset the probe may choose ends here, before any run
    check_before_choice(cfg, es_cpu_preset(env, llm_envs.registry.resolve_id(cfg.env)),
                        lambda c: iteration_size(c, len(train_examples)))
    run = RunDir(cfg.out, resume=cfg.resume is not None, is_main=dist.is_main)
    run.write_config(to_dict(cfg))
    dist.hint = f"continue it with: python -m trainers.es --resume {run.path} (on any number of processes)"
    scorer = llm_envs.BatchScorer(env, cfg.score_workers)
    say = tqdm.write if dist.is_main else (lambda *a, **k: None)

    # Resume: the newest weight checkpoint, then the updates logged after it re-applied.
    log = UpdateLog(run, resume=cfg.resume is not None)
    done = log.done
    model, tokenizer, params, layers = load_weights(cfg, dist, log, device)
    dist.phase = "the engine's start"
    # after the replay: the current weights; on adapters, vllm keeps a LoRA slot per member of a call
    slots = math.ceil((cfg.population or 32) / dist.world) if cfg.lora else 0
    engine = make_engine(runtime.engine_options(cfg), model, tokenizer, lora_members=slots)
    fit = es_fit(cfg, dist, engine, env, params, layers, train_examples, device.type)  # --preset, from a probe here
    per_iteration, per_step = iteration_size(cfg, len(train_examples))
    run.write_config(to_dict(cfg))  # the preset's values, and where each value came from
    run.note_runtime(model, done, runtime,
                     splits=measured_split_counts(env, ("train", cfg.eval_split), cfg.eval_limit))
    if cfg.resume and dist.is_main:
        say(log.resumed())
    budget = log.budget(cfg.max_samples)
    for line in start_lines(cfg, model, params, layers, runtime.precision, engine.name, run.path, dist.world, per_iteration):
        say(line)

    left = budget.steps_left(cfg.iterations - done, per_step)  # iterations this invocation will run
    members = len(range(dist.rank, cfg.population, dist.world))  # this process's share, as for eval_rows
    held = eval_examples(env, cfg.eval_split, cfg.eval_limit)[::dist.world]  # process 0's share, the largest
    eval_rows = len(held)
    clock = es_clock(cfg, say, device.type, left, members, per_iteration, eval_rows,
                     evaluations_left(done, done + left, cfg.eval_every), engine.finished_rows_only) \
        if dist.is_main else None
    held_out = HeldOut(cfg, engine, scorer, run, dist, say, cfg.gen_batch_size or 32, clock,
                       done if cfg.resume else None)

    say(fit.line("ES", cfg.env, left, eval_rows, evaluations_left(done, done + left, cfg.eval_every),
                 fit.pace.evaluation(prompt_ids(engine, held), cfg.max_new_tokens, cfg.gen_batch_size or 32)))
    if done == 0:
        held_out(0)
    last = done
    multiturn, warned = is_multiturn(env), False  # episodes: their statistics logged, the first-turn warning said once
    check = check_command(cfg.env, cfg.env_args, cfg.model, cfg.max_new_tokens)
    iterations = bar(range(done + 1, cfg.iterations + 1), initial=done, total=cfg.iterations, desc="ES",
                     unit="iteration", run=True, disable=not dist.is_main)
    for it in iterations:
        if not budget.allows(per_step):  # a run never exceeds --max-samples: only whole iterations start
            say(f"sample budget reached: {budget.samples} responses, and one more iteration ({per_step}) would exceed "
                f"--max-samples {cfg.max_samples}")
            break
        start, cpu = time.perf_counter(), time.process_time()
        dist.phase = f"iteration {it}"
        batch = batch_for(train_examples, per_iteration, cfg.seed, it)
        tally = EpisodeTally() if multiturn else None
        seeds, signs, rewards, accuracy, tokens = es_iteration(cfg, it, engine, scorer, params, layers, batch,
                                                               dist.rank, dist.world, clock, tally)
        # the one exchange of an iteration: 3 x N numbers, each member's on exactly one rank (so the sum is
        # exact), and on a multi-turn env this process's episode sums, added up over the ranks alike
        summed = dist.sum(np.concatenate([np.stack([rewards, accuracy, tokens]).ravel(),
                                          tally.sums if tally is not None else []]))
        rewards, accuracy, tokens = summed[:3 * cfg.population].reshape(3, cfg.population)
        if tally is not None:
            tally.sums = summed[3 * cfg.population:]
        z = normalise(rewards, cfg.rank_shaping)
        if z is None:
            say(f"[iter {it}] all {cfg.population} rewards equal ({rewards[0]:.4f}): update skipped")
            upd_seeds, coefs = [], []
        else:
            upd_seeds, coefs = update_coefficients(seeds, signs, z, cfg.alpha)
            update_weights(cfg, params, layers, upd_seeds, coefs)
            engine.sync_weights()
        if cfg.check_every and it % cfg.check_every == 0:  # before the iteration is logged: resume redoes it
            dist.same_weights(weights_of_record(model, params), f"after iteration {it}")
        budget.add(per_step, tokens.sum())
        record = {"iteration": it, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
                  "reward_min": float(rewards.min()), "reward_max": float(rewards.max()),
                  "accuracy": float(accuracy.mean()), "skipped": z is None, "seconds": time.perf_counter() - start,
                  "cpu_seconds": time.process_time() - cpu,
                  "tokens": budget.tokens, "tokens_iteration": int(tokens.sum()), "samples": budget.samples,
                  **(tally.means() if tally is not None else {})}
        run.log(record, it)
        warning = tally is not None and not warned and cut_short(tally, cfg.max_new_tokens, env.stop_strings, check)
        if warning:
            say(f"[iter {it}] {warning}")
            warned = True
        last = it
        if cfg.eval_every and it % cfg.eval_every == 0 and it != cfg.iterations and budget.allows(per_step):
            held_out(it)
        if dist.is_main:  # the update record is what resume replays: written once the iteration is whole
            log.append({"iteration": it, "seeds": upd_seeds, "coefficients": coefs, "skipped": z is None,
                        "rewards": rewards.tolist(), "samples": budget.samples, "tokens": budget.tokens})
            if it % cfg.checkpoint_every == 0:
                run.save_checkpoint(model, tokenizer, it, {"iteration": it}, tensors=masters_of(params))
        if it % cfg.checkpoint_every == 0:
            dist.wait_for_main()  # the others wait for the save here, not inside the next all-reduce
        iterations.set_postfix(reward=f"{record['reward_mean']:.4f}", sec=f"{record['seconds']:.1f}")
    iterations.close()
    if cfg.check_every and not (last % cfg.check_every == 0 and last > done):  # the end is always checked
        dist.same_weights(weights_of_record(model, params), f"after iteration {last}")
    if last not in held_out.evaluated:  # also after a kill during the final evaluation: the final model is measured
        held_out(last)
    dist.phase = "the final save"
    if dist.is_main:
        save_model(model, tokenizer, run.path / "final")
        summarize(run)
    run.close()
    engine.close()
    scorer.close()
    env.close()
    dist.wait_for_main()
    return run.path


def resolve(argv: list[str] | None = None) -> ESConfig:
    """The config of a new run, or of a resumed run (its saved config, overridden by flags)."""
    return resolve_config(ESConfig, "es", argv, description=__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> None:
    run_main(resolve, train, argv)
