"""The evaluation harness (``python -m eval`` is its command line): measure a model on an
environment: greedy pass@1 (the paper's protocol), unbiased pass@k from sampled responses, and KL
from a base model, with per-example results and a summary on disk.

Responses come from ``trainers.common.rollout`` (the same generation, scoring and held-out examples as
the trainers' own ``eval_pass@1``), so greedy pass@1 here equals a trainer's logged one for the
same model, split and ``max_new_tokens``. An environment's default splits are its
``eval_splits`` (MATH-v0: its five benchmarks).

Writes OUT/ENV.SPLIT.TAG.jsonl (one line per response: prompt id, sample, the opening of the
assistant's turn, the completion that continues it, reward, correct, ...) and
OUT/ENV.SPLIT.TAG.summary.json (what ``python -m eval.table`` reads); OUT defaults to RUN/eval
for a trainer run, else runs/eval/MODEL. Results are cached by model fingerprint, weight dtype and
device type, environment, examples, split and decoding settings
(see ``eval.cache``): the cache holds the generations only, and every run scores them afresh with
the environment's current scorer, so a fixed reward function is never served stale rewards.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import llm_envs
from eval import SUMMARY_SUFFIX, ModelSpec, describe_model, model_name
from eval.cache import Cache, cache_key, file_hash
from eval.passk import mean_std, pass_at_ks, pass_hat_ks
from llm_envs.multiturn import is_multiturn
from trainers.common import adapters, runtime, tracking
from trainers.common.config import ConfigError, check, check_engine, check_tracking, env_kwargs, make_env
from trainers.common.episodes import EpisodeTally, check_command, cut_short, episode_row, episode_summary
from trainers.common.hardware import describe
from trainers.common.models import model_fingerprint, resolve_device
from trainers.common.precision import DTYPE_CHOICES, dtype_name, parse_dtype
from trainers.common.progress import bar
from trainers.common.rollout import eval_examples, rollout
from trainers.common.run_dir import recorded_dtype, recorded_engine
from trainers.common.tracking import REPORT_TO_HELP
from trainers.engines import AUTO, ENGINES, EngineOptions, make_engine
from trainers.engines.generation import encode_prompts
from trainers.engines.options import ENGINES_HELP
from trainers.engines.sampling import row_seeds

DEFAULT_ENV = "Countdown-v0"  # --env for a model that is not a trainer run

#: Decoding presets: the paper's conciseness protocol (20 samples per prompt, KL to the base).
PRESETS: dict[str, dict[str, Any]] = {"conciseness": {"samples": 20, "temperature": 1.0, "kl_to": "base"}}


@dataclass
class EvalConfig(EngineOptions):
    engine: str | None = field(default=None, metadata={
        "help": f"generation engine: auto, {ENGINES_HELP}; default: the engine a trainer run generated with (its "
                f"runtime.jsonl), so its logged held-out numbers are reproduced; auto for any other model (native "
                f"for a Llama/Qwen2 model on CPU or CUDA, hf otherwise)",
        "choices": [AUTO, *ENGINES]})
    env: str | None = field(default=None, metadata={"help": "environment id ('my_module:My-v0' imports my_module); "
                                                          "default: a trainer run's env, with its --env-args; "
                                                          f"{DEFAULT_ENV} for any other model"})
    model: str = field(default="smollm2-135m", metadata={"help": "HF id, local model dir, smollm2-135m, or a trainer run dir (its final/ model)"})
    split: str | None = field(default=None, metadata={"help": "split(s), comma-separated; None = the env's evaluation splits (test; MATH-v0: its five benchmarks)"})
    data: str | None = field(default=None, metadata={"help": "a data file for the evaluated split (replaces the built-in one)"})
    out: str | None = field(default=None, metadata={"help": "output directory; None = RUN/eval for a run, else runs/eval/MODEL"})
    samples: int = field(default=1, metadata={"help": "responses (rollouts) per prompt; > 1 adds unbiased pass@k and "
                                                      "pass^k for k = 1..samples", "aliases": ["-r"]})
    temperature: float | None = field(default=None, metadata={"help": "sampling temperature; None = 0 (greedy), or 1.0 with --samples > 1"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling threshold"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    kl_to: str | None = field(default=None, metadata={"help": "base model for mean per-token KL (k3) on the sampled responses, both "
                                                              "models at the sampling temperature (needs --temperature > 0 and "
                                                              "--top-p 1); 'base' = the run's base model"})
    preset: str | None = field(default=None, metadata={"help": "conciseness = the paper's protocol: 20 samples at temperature 1, KL to the base", "choices": list(PRESETS)})
    max_new_tokens: int | None = field(default=None, metadata={"help": "generation budget; None = the env's"})
    batch_size: int = field(default=32, metadata={"help": "sequences per generate() call"})
    limit: int | None = field(default=None, metadata={"help": "evaluate the first K examples of each split only",
                                                      "aliases": ["-n"]})
    label: str | None = field(default=None, metadata={"help": "method label in tables and plots; None = inferred from the run's config"})
    env_args: str | None = field(default=None, metadata={"help": "JSON object of environment options"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda; None = cuda if available"})
    dtype: str | None = field(default="auto", metadata={
        "help": "fp32 / bf16 weights; auto = the compute dtype a trainer run recorded (its runtime.jsonl), else bf16 "
                "on a CUDA GPU that supports it and, on CPU, whichever a short probe of the model's layer shapes "
                "measured faster (cached; trainers/common/precision.py)", "choices": DTYPE_CHOICES})
    cache: str | None = field(default=None, metadata={"help": "cache directory or 'off'; None = $LLM_ENVS_EVAL_CACHE, else ~/.cache/llm_envs/eval"})
    score_workers: int | None = field(default=None, metadata={"help": "scoring processes (0: in this process, for pure-Python scorers); None = the env's"})
    report_to: str = field(default="none", metadata={"help": REPORT_TO_HELP.replace("besides log.jsonl", "besides "
                                                                                      "the summary files")})
    report_group: str | None = field(default=None, metadata={"help": "tracking group (default: a trainer run's own)"})

    def validate(self) -> None:
        check_tracking(self.report_to)
        for name, value in PRESETS.get(self.preset or "", {}).items():
            if name == "samples" and self.samples == 1 or name != "samples" and getattr(self, name) is None:
                setattr(self, name, value)
        if self.temperature is None:
            self.temperature = 1.0 if self.samples > 1 else 0.0
        check(self.samples >= 1, "samples", "must be >= 1")
        check(self.temperature >= 0, "temperature", "must be >= 0")
        check(self.samples == 1 or self.temperature > 0, "samples", "needs --temperature > 0 (greedy samples are identical)")
        check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        # k3 is unbiased only on tokens sampled from the distribution whose KL it estimates
        check(not self.kl_to or self.temperature > 0, "kl_to", "needs sampled responses (--temperature > 0): "
              "greedy responses are not samples, so k3 on them does not estimate KL")
        check(not self.kl_to or self.top_p == 1, "kl_to", "needs --top-p 1: nucleus sampling draws from a truncated "
              "distribution, on which k3 does not estimate KL to the base model")
        check(self.batch_size >= 1, "batch_size", "must be >= 1")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        check(self.limit is None or self.limit >= 1, "limit", "must be >= 1")
        if self.env is None:  # a run is measured on what it trained on, as its held-out numbers were
            self.env, trained_args = run_env(self.model) or (DEFAULT_ENV, None)
            self.env_args = self.env_args if self.env_args is not None else trained_args
        env_kwargs(self.env_args)  # validates: a JSON object or nothing
        if self.engine is None:
            self.engine = run_engine(self.model) or AUTO
        if self.dtype in (None, "auto"):
            self.dtype = run_dtype(self.model) or "auto"
        check_engine(self)

    @property
    def tag(self) -> str:
        """File-name tag of the decoding settings."""
        tag = "greedy" if self.temperature == 0 else f"t{self.temperature:g}-k{self.samples}"
        tag += f"-p{self.top_p:g}" if self.top_p < 1 else ""
        return tag + ("-kl" if self.kl_to else "") + (f"-n{self.limit}" if self.limit else "")


def trainer_run(model: str) -> ModelSpec | None:
    """What ``--model`` names when it is a trainer run (the run, its final/ or a checkpoint), else None."""
    try:
        spec = describe_model(model)
    except (FileNotFoundError, OSError, ValueError):
        return None
    return spec if spec.run else None


def run_dtype(model: str) -> str | None:
    """The compute dtype a trainer run recorded at its first start, as a ``--dtype`` value, else None."""
    spec = trainer_run(model)
    recorded = recorded_dtype(spec.run) if spec else None
    return dtype_name(parse_dtype(recorded)) if recorded else None


def run_env(model: str) -> tuple[str, str | None] | None:
    """The env and ``--env-args`` (a JSON string) a trainer run trained on (its config.yaml), else None."""
    spec = trainer_run(model)
    if not spec or not spec.config.get("env"):
        return None
    args = spec.config.get("env_args")
    return str(spec.config["env"]), json.dumps(args) if isinstance(args, dict) else args


def run_engine(model: str) -> str | None:
    """The engine a trainer run recorded, else None."""
    spec = trainer_run(model)
    return recorded_engine(spec.run) if spec else None


class LazyModel:
    """A model loaded on first use, on ``device`` in ``dtype`` (resolved at once, so they are part
    of cache keys); its fingerprint is remembered per weight files and dtype, so a fully cached
    evaluation of a local model never loads it."""

    def __init__(self, path: str, device: str | None, cache: Cache, dtype: str | None = None,
                 engine: EngineOptions | None = None):
        self.path, self.cache = path, cache
        options = (engine or EngineOptions()).engine_options()
        self._engine = None
        try:  # the model's config, the dtype and the engine, resolved once from the config alone
            self.device = resolve_device(device)
            self.resolved = runtime.resolve(path, self.device, dtype, options.engine)
        except ValueError as exc:  # an unavailable device, an unknown dtype
            raise ConfigError(str(exc)) from None
        self.dtype = self.resolved.precision.torch_dtype
        self.engine_options = self.resolved.engine_options(options)
        self.engine_why = self.resolved.engine_why
        self._loaded: tuple[Any, Any] | None = None
        self._fingerprint: str | None = None

    @property
    def runtime(self) -> dict[str, str]:
        """What besides the weights changes the generated text: the device type and the dtype."""
        return {"device": self.device.type, "dtype": str(self.dtype).removeprefix("torch.")}

    @property
    def machine(self) -> dict[str, str]:
        """Where the times came from: the CPU (name, bf16 units) and the GPU, if used."""
        return describe(self.device)

    def get(self) -> tuple[Any, Any]:
        if self._loaded is None:
            from trainers.common.models import load_model

            try:
                self._loaded = load_model(self.path, device=self.device, dtype=self.dtype)
            except ValueError as exc:  # a malformed name
                raise ConfigError(f"model {self.path!r}: {exc}") from None
        return self._loaded

    @property
    def engine_name(self) -> str:
        """The engine that generates (part of cache keys)."""
        return self.engine_options.engine

    def engine(self):
        """The generation engine over the loaded model (started on first use, then kept)."""
        if self._engine is None:
            self._engine = make_engine(self.engine_options, *self.get())
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            stamp = _weights_stamp(self.path, self.runtime["dtype"])
            known = self.cache.get(stamp) if stamp else None
            if known:
                self._fingerprint = known["fingerprint"]
            else:
                self._fingerprint = model_fingerprint(*self.get())  # weights and tokenizer
                if stamp:
                    self.cache.put(stamp, {"fingerprint": self._fingerprint, "path": self.path})
        return self._fingerprint


def is_base_of_adapter(base: str, model: str) -> bool:
    """Whether ``model`` is a LoRA adapter (a run trained with ``--lora-rank``) on ``base``."""
    return adapters.is_adapter_dir(model) and adapters.base_name(base) == adapters.adapter_base(model)


class AdaptersOff:
    """The base model of an adapter run, for KL: the run's own loaded model with its adapters disabled
    (``trainers.common.adapters.BaseOf``), no second copy of the weights. Its fingerprint (a cache
    key) derives from the adapter model's, which covers the base weights."""

    def __init__(self, model: LazyModel):
        self.model, self.path = model, adapters.adapter_base(model.path)

    @property
    def runtime(self) -> dict[str, str]:
        return self.model.runtime

    def get(self) -> tuple[Any, Any]:
        lm, tokenizer = self.model.get()
        return adapters.BaseOf(lm), tokenizer

    @property
    def fingerprint(self) -> str:
        return "adapters-off-" + hashlib.sha256(self.model.fingerprint.encode()).hexdigest()[:16]


def _weights_stamp(path: str, dtype: str) -> str | None:
    """A cache key of a local model directory's files (names, sizes, mtimes) loaded in ``dtype``
    (the fingerprint hashes the loaded tensors); None for a model that is not a local directory."""
    from trainers.common.models import ALIASES, cache_dir

    directory = cache_dir() / ALIASES[path.lower()] if path.lower() in ALIASES else Path(path).expanduser()
    if not directory.is_dir():
        return None
    files = sorted(p for p in directory.iterdir() if p.is_file())
    return cache_key(kind="weights", path=str(directory.resolve()), dtype=dtype,
                     files=[(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files])


def examples_hash(examples) -> str:
    """Hash of the examples' content (prompts, answers, metadata): any data change misses the cache."""
    blob = json.dumps([[e.id, e.prompt, e.answer, e.meta] for e in examples], sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


# ----- measuring ----------------------------------------------------------------------------------


def generate_and_score(model: LazyModel, scorer: llm_envs.BatchScorer, env_id: str, env_args: dict, examples,
                       cfg: EvalConfig, cache: Cache, split: str) -> tuple[dict[str, Any], str, int]:
    """Responses of ``examples`` and their scores: (entry, cache key, how many responses came from
    the cache: all of them, those of an evaluation killed before, or none).

    The cache holds generations only (texts, token ids, counts), keyed by everything that
    determines them: weights, device type and dtype, environment, examples and decoding. Rewards
    and verdicts are computed by ``scorer`` on every call, cached or not (scoring costs a few % of
    generating), so results always reflect the environment's current reward code. Single-turn
    responses are generated in chunks, each cached as it ends (``generate_chunks``), so a killed
    evaluation resumes from the chunks it finished."""
    sampling = cfg.temperature > 0
    decoding = dict(max_new_tokens=cfg.max_new_tokens, samples=cfg.samples, temperature=cfg.temperature,
                    top_p=cfg.top_p if sampling else 1.0, seed=cfg.seed if sampling else None,
                    batch_size=cfg.batch_size if sampling else None)  # sampled text depends on the batch size
    key = cache_key(kind="generate", model=model.fingerprint, runtime=model.runtime,
                    engine=model.engine_name, env=env_id, env_args=env_args,
                    split=split, data=file_hash(cfg.data) if cfg.data else None, examples=examples_hash(examples),
                    decoding=decoding)
    per_completion = [e for e in examples for _ in range(cfg.samples)]  # rows are prompt-major
    episodes = is_multiturn(scorer.env)  # an episode's outcome needs the env's replies: regenerated, never cached
    entry = None if episodes else cache.get(key)
    from_cache = len(entry["rows"]) if entry is not None else 0
    if entry is None and not episodes:
        entry, from_cache = generate_chunks(model, scorer, examples, cfg, cache, key, decoding, f"{env_id}/{split}")
    if not episodes:
        scores = scorer.score_batch([r["completion"] for r in entry["rows"]], per_completion)
    else:
        r = rollout(model.engine(), scorer, examples, cfg.max_new_tokens, cfg.batch_size, cfg.temperature,
                    cfg.seed if sampling else None, cfg.samples, cfg.top_p, progress=f"{env_id}/{split}")
        out = r.generation
        rows = [dict(id=e.id, sample=j % cfg.samples, completion=text, tokens=n, finished=done, token_ids=ids)
                for j, (e, text, n, done, ids) in enumerate(zip(r.examples, out.texts, out.num_tokens, out.finished,
                                                                 out.token_ids))]
        rows = [row | episode_row(ep) for row, ep in zip(rows, r.episodes)]  # turns, tool calls and errors, the conversation
        entry = {"rows": rows, "seconds": out.seconds, "tokens": out.total_tokens, "decoding": decoding,
                 "runtime": model.runtime}
        scores = r.scores
    # The scorer saw opening + completion; the completion (and its token ids, which KL covers) is generated text only.
    rows = [{"id": row["id"], "sample": row["sample"], "opening": e.opening, "completion": row["completion"],
             "reward": s.reward, "correct": bool(s.correct), "parts": s.parts, "error": s.error, **row}
            for row, e, s in zip(entry["rows"], per_completion, scores)]
    return {**entry, "rows": rows}, key, from_cache


def generate_chunks(model: LazyModel, scorer: llm_envs.BatchScorer, examples, cfg: EvalConfig, cache: Cache, key: str,
                    decoding: dict[str, Any], label: str) -> tuple[dict[str, Any], int]:
    """The generations of ``examples``, every ``--batch-size`` prompts (a chunk, with all their
    samples) cached under its own key as it ends: a killed evaluation finds the chunks it finished
    and generates only the rest. Once all are there, the split's entry is cached under ``key`` and
    the chunks are dropped. ``scorer``'s env gives the stop strings; scoring is the caller's. A
    sampled row's seed is derived from (``--seed``, its index in the split), as one call over the
    split would derive it, so chunks give what one call gives.
    Returns the entry and how many of its rows an earlier run had generated."""
    sampling = cfg.temperature > 0
    seeds = row_seeds(cfg.seed, len(examples) * cfg.samples) if sampling else None
    rows: list[dict[str, Any]] = []
    seconds, tokens, resumed, chunk_keys = 0.0, 0, 0, []
    prompts = bar(total=len(examples), desc=f"{label} (chunks of {cfg.batch_size} prompts)", unit="prompt",
                  disable=len(examples) <= cfg.batch_size)
    for start in range(0, len(examples), cfg.batch_size):
        part = examples[start:start + cfg.batch_size]
        chunk_keys.append(cache_key(kind="generate-chunk", entry=key, start=start, prompts=len(part)))
        chunk = cache.get(chunk_keys[-1])
        if chunk is not None:
            resumed += len(chunk["rows"])
        else:
            span = slice(start * cfg.samples, (start + len(part)) * cfg.samples)
            out = rollout(model.engine(), scorer, part, cfg.max_new_tokens, cfg.batch_size, cfg.temperature,
                          seeds[span] if seeds else None, cfg.samples, cfg.top_p, progress=label, score=False).generation
            chunk = {"chunk": start, "seconds": out.seconds, "tokens": out.total_tokens,
                     "rows": [dict(id=e.id, sample=j % cfg.samples, completion=text, tokens=n, finished=done,
                                   token_ids=ids)
                              for j, (e, text, n, done, ids) in enumerate(zip(
                                  [e for e in part for _ in range(cfg.samples)], out.texts, out.num_tokens,
                                  out.finished, out.token_ids))]}
            cache.put(chunk_keys[-1], chunk)
        rows += chunk["rows"]
        seconds += chunk["seconds"]
        tokens += chunk["tokens"]
        prompts.update(len(part))
    prompts.close()
    entry = {"rows": rows, "seconds": seconds, "tokens": tokens, "decoding": decoding, "runtime": model.runtime}
    cache.put(key, entry)
    for chunk_key in chunk_keys:
        cache.delete(chunk_key)
    return entry, resumed


def measure_kl(model: LazyModel, base: LazyModel, examples, entry: dict[str, Any], gen_key: str, cfg: EvalConfig,
               cache: Cache) -> list[float]:
    """Per-response mean k3 KL[model || base] of the entry's responses, both models at the sampling
    temperature (cached)."""
    from eval.kl import kl_batch_size, kl_cache_key, response_kl

    key = kl_cache_key(gen_key, base.fingerprint, base.runtime, cfg.temperature, cfg.batch_size)
    hit = cache.get(key)
    if hit is not None:
        return hit["kl"]
    if base.fingerprint == model.fingerprint:  # a model against itself: exactly 0, no forward pass
        kl = [0.0] * len(entry["rows"])
    else:
        lm, tokenizer = model.get()
        prompts = encode_prompts(tokenizer, [e.prompt for e in examples])  # rows are prompt-major
        kl = response_kl(lm, base.get()[0], [prompts[i // cfg.samples] for i in range(len(entry["rows"]))],
                         [r["token_ids"] for r in entry["rows"]], kl_batch_size(cfg.batch_size),
                         tokenizer.pad_token_id or 0, cfg.temperature)
    cache.put(key, {"kl": kl})
    return kl


def summarize_split(rows: list[dict[str, Any]], entry: dict[str, Any], cfg: EvalConfig,
                    kl: list[float] | None) -> dict[str, Any]:
    """The split's numbers: pass@1, pass@k, reward and KL mean/std, correct rate, tokens/s."""
    per_prompt = [[r["correct"] for r in rows[i:i + cfg.samples]] for i in range(0, len(rows), cfg.samples)]
    passk, pass_all = pass_at_ks(per_prompt), pass_hat_ks(per_prompt)
    rewards = [r["reward"] for r in rows]
    # A part a row lacks counts 0 (a key only some turns or episodes report is not their average).
    names = list(dict.fromkeys(name for r in rows for name in (r["parts"] or {})))
    parts = {name: [(r["parts"] or {}).get(name, 0.0) for r in rows] for name in names}
    reward_mean, reward_std = mean_std(rewards)
    kl_mean, kl_std = mean_std(kl) if kl is not None else (None, None)
    return {"pass@1": passk.get(1, 0.0), "pass@k": {str(k): v for k, v in passk.items()},
            "pass^k": {str(k): v for k, v in pass_all.items()},
            "correct_rate": sum(r["correct"] for r in rows) / max(1, len(rows)),
            "reward_mean": reward_mean, "reward_std": reward_std,
            "parts_mean": {k: sum(v) / len(v) for k, v in parts.items()},
            "kl_mean": kl_mean, "kl_std": kl_std, "n": len(per_prompt), "responses": len(rows),
            "errors": sum(r["error"] is not None for r in rows), "tokens": entry["tokens"],
            "seconds": entry["seconds"], "tokens_per_second": entry["tokens"] / max(entry["seconds"], 1e-9),
            **episode_summary(rows)}


def run(cfg: EvalConfig) -> list[dict[str, Any]]:
    """Run the evaluation ``cfg`` describes; returns one summary record per split."""
    spec = model_spec(cfg)
    try:
        env_id = llm_envs.registry.resolve_id(cfg.env)
    except llm_envs.UnknownEnvError as exc:
        raise ConfigError(f"--env: {exc}") from None
    env_args = env_kwargs(cfg.env_args)
    splits = _splits(cfg, env_id)
    env = make_env(env_id, env_args, splits=tuple(splits), **({"data": {splits[0]: cfg.data}} if cfg.data else {}))
    cfg.max_new_tokens = cfg.max_new_tokens or env.max_new_tokens
    scorer = llm_envs.BatchScorer(env, cfg.score_workers)
    cache = Cache(None if cfg.cache in (None, "off") else cfg.cache, enabled=cfg.cache != "off")
    model = LazyModel(spec.path, cfg.device, cache, cfg.dtype, cfg.engine_options())
    base = None
    if cfg.kl_to and is_multiturn(env):
        raise ConfigError(f"--kl-to: {env_id} runs multi-turn episodes; KL over episodes (the model's tokens only) "
                          f"is not measured yet")
    if cfg.kl_to:
        base_path = spec.base_model if cfg.kl_to == "base" else cfg.kl_to
        base = model if base_path == spec.path else AdaptersOff(model) if is_base_of_adapter(base_path, spec.path) \
            else LazyModel(base_path, cfg.device, cache, cfg.dtype)
    out_dir = Path(cfg.out) if cfg.out else _default_out(spec)
    summaries = []
    tracker = start_tracking(cfg, spec, model, out_dir, env_id)
    try:
        for split in splits:
            try:
                examples = eval_examples(env, split, cfg.limit)
            except KeyError as exc:
                raise ConfigError(f"--split: {exc.args[0]}") from None
            if not examples:
                raise ConfigError(f"--split {split}: no examples")
            print(f"{env_id}/{split}: {len(examples)} prompts x {cfg.samples} sample(s), {_decoding_text(cfg)}",
                  file=sys.stderr, flush=True)
            entry, key, from_cache = generate_and_score(model, scorer, env_id, env_args, examples, cfg, cache, split)
            kl = measure_kl(model, base, examples, entry, key, cfg, cache) if base is not None else None
            rows = [{k: v for k, v in r.items() if k != "token_ids"} | ({"kl": kl[i]} if kl else {})
                    for i, r in enumerate(entry["rows"])]
            summary = summary_header(cfg, spec, env_id, env_args, split, model, base, env.stop_strings) | \
                summarize_split(rows, entry, cfg, kl)
            summary["cached"], summary["cached_rows"] = from_cache == len(rows), from_cache
            write_split(out_dir, cfg, spec, env_id, split, rows, summary)
            print(_line(summary), flush=True)
            if "turns" in rows[0]:  # episodes that mostly never reached the env: say so, and how to look
                tally = EpisodeTally()
                tally.add(rows)
                warning = cut_short(tally, cfg.max_new_tokens, env.stop_strings,
                                    check_command(cfg.env, cfg.env_args, cfg.model, cfg.max_new_tokens))
                if warning:
                    print(f"{env_id}/{split}: {warning}", file=sys.stderr, flush=True)
            summaries.append(summary)
            if tracker is not None:
                tracker.log(tracked_numbers(summary, split if len(splits) > 1 else None), spec.iteration or 0)
    finally:
        if tracker is not None:
            tracker.close()
        model.close()
        scorer.close()
        env.close()
    if len(summaries) > 1:
        from eval.table import render, split_table

        for table in split_table(summaries):
            print("\n" + render([table], "markdown"))
    return summaries


# ----- helpers --------------------------------------------------------------------------------------


def start_tracking(cfg: EvalConfig, spec: ModelSpec, model: LazyModel, out_dir: Path,
                   env_id: str) -> tracking.Tracker | None:
    """The evaluation's tracked run (``--report-to``; None for ``none``): its config is the eval's
    options and this machine, its group ``--report-group`` or the trainer run's own."""
    backends = tracking.parse_report_to(cfg.report_to)
    if not backends:
        return None
    name = f"eval {model_name(spec.path)} {env_id} {cfg.tag} {time.strftime('%Y%m%d-%H%M%S')}"
    config = asdict(cfg) | {"machine": model.machine, "runtime": model.runtime, "model_method": spec.method}
    return tracking.Tracker(backends, out_dir, name, config, group=cfg.report_group or spec.config.get("report_group"),
                            job="eval")


def tracked_numbers(summary: dict[str, Any], split: str | None) -> dict[str, float]:
    """A split's summary in the shared vocabulary (``trainers/common/tracking.py``): ``eval/pass@1``,
    ``eval/reward``, ``eval/kl``, ``eval/pass@k/K``, ``eval/pass^k/K``, tokens per second and
    memory; under ``eval/SPLIT/`` when the evaluation measures several splits."""
    prefix = f"eval/{split}/" if split else "eval/"
    numbers = {"pass@1": summary["pass@1"], "reward": summary["reward_mean"], "reward_std": summary["reward_std"],
               "correct_rate": summary["correct_rate"], "n": summary["n"], "kl": summary["kl_mean"],
               **{f"pass@k/{k}": v for k, v in summary["pass@k"].items()},
               **{f"pass^k/{k}": v for k, v in summary["pass^k"].items()}}
    return {prefix + k: float(v) for k, v in numbers.items() if v is not None} | {
        "perf/tokens_per_second": float(summary["tokens_per_second"]), "perf/peak_memory_gb": tracking.peak_memory_gb()}


def model_spec(cfg: EvalConfig) -> ModelSpec:
    """What ``--model`` names (a model, or a run directory and its method, seed, base), checked to exist."""
    try:
        spec = describe_model(cfg.model, cfg.label)
    except FileNotFoundError as exc:
        raise ConfigError(f"--model: {exc}") from None
    looks_local = cfg.model.startswith((".", "/", "~")) or cfg.model.count("/") > 1
    if looks_local and not Path(cfg.model).expanduser().exists():
        raise ConfigError(f"--model: no such model or run directory {cfg.model}")
    if spec.run is None and cfg.kl_to == "base":
        cfg.kl_to = spec.path  # a plain model's base is itself: KL 0, the Original row of Table 2
    elif spec.run is None and cfg.kl_to:
        spec.base_model = cfg.kl_to  # a plain fine-tuned model: its base is what KL is measured to
    return spec


def _splits(cfg: EvalConfig, env_id: str) -> list[str]:
    if cfg.split:
        splits = [s.strip() for s in cfg.split.split(",") if s.strip()]
    else:
        splits = list(llm_envs.registry.env_class(env_id).eval_splits)
    if cfg.data and len(splits) != 1:
        raise ConfigError("--data: give exactly one --split with a data file")
    if cfg.data and not Path(cfg.data).exists():
        raise ConfigError(f"--data: no such file {cfg.data}")
    return splits


def _default_out(spec: ModelSpec) -> Path:
    if spec.run:
        return Path(spec.run) / "eval"
    return Path("runs") / "eval" / re.sub(r"[^\w.-]+", "_", model_name(spec.path))


def summary_header(cfg: EvalConfig, spec: ModelSpec, env_id: str, env_args: dict, split: str, model: LazyModel,
                   base: LazyModel | None, stop_strings: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a split's summary records besides its numbers: the env (its options and the stop strings
    its turns end at), model, decoding and engine."""
    return {"env": env_id, "env_args": env_args, "stop_strings": list(stop_strings), "data": cfg.data, "split": split,
            "model": spec.path,
            "method": spec.method, "base_model": spec.base_model, "run": spec.run, "iteration": spec.iteration,
            "seed": spec.seed, "hparams": spec.hparams, "samples": cfg.samples, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "sampling_seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens, "limit": cfg.limit,
            "kl_to": base.path if base else None, "kl_estimator": "k3" if base else None,
            "kl_temperature": cfg.temperature if base else None,  # both models' log-probs at the sampling temperature
            "fingerprint": model.fingerprint, **model.runtime, "engine": model.engine_name,
            "engine_why": model.engine_why,
            "machine": model.machine,
            "base_fingerprint": base.fingerprint if base else None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}


def write_split(out_dir: Path, cfg: EvalConfig, spec: ModelSpec, env_id: str, split: str, rows, summary) -> None:
    """A split's rows (``.jsonl``) and summary under ``out_dir``; ``summary["file"]`` names the latter."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"ckpt{spec.iteration:06d}." if spec.iteration is not None else ""
    stem = re.sub(r"[^\w.-]+", "_", f"{prefix}{env_id}.{split}.{cfg.tag}")
    (out_dir / f"{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out_dir / f"{stem}{SUMMARY_SUFFIX}").write_text(json.dumps(summary, indent=1) + "\n")
    summary["file"] = str(out_dir / f"{stem}{SUMMARY_SUFFIX}")


def _decoding_text(cfg: EvalConfig) -> str:
    text = "greedy" if cfg.temperature == 0 else f"temperature {cfg.temperature:g}, top_p {cfg.top_p:g}, seed {cfg.seed}"
    return f"{text}, max_new_tokens {cfg.max_new_tokens}"


def _line(s: dict[str, Any]) -> str:
    text = (f"{s['env']}/{s['split']} [{s['method']}] pass@1 {s['pass@1']:.4f}  reward {s['reward_mean']:.4f} "
            f"+- {s['reward_std']:.4f}  correct {s['correct_rate']:.3f}  (n={s['n']} x {s['samples']})")
    if s["samples"] > 1:
        text += f"  pass@{s['samples']} {s['pass@k'][str(s['samples'])]:.4f}  pass^{s['samples']} " \
                f"{s['pass^k'][str(s['samples'])]:.4f}"
    if s["kl_mean"] is not None:
        text += f"  KL {s['kl_mean']:.4f} +- {s['kl_std']:.4f}"
    if "turns_mean" in s:
        text += (f"  turns {s['turns_mean']:.2f}  tool calls {s['tool_calls_mean']:.2f}  "
                 f"tool errors {s['tool_errors_mean']:.2f}")
    if s["samples"] > 1:
        text += "\n" + "\n".join(f"  {name}  " + "  ".join(f"k={k}: {s[name][str(k)]:.4f}" for k in shown_ks(s["samples"]))
                                  for name in ("pass@k", "pass^k"))
    speed = f"{s['tokens']} tokens in {s['seconds']:.1f} s = {s['tokens_per_second']:.1f} tokens/s"
    if s["cached"]:
        speed += " (cached)"
    elif s.get("cached_rows"):
        speed += f" (resumed: {s['cached_rows']} of {s['responses']} responses from the cache)"
    return f"{text}\n  {speed} -> {s['file']}"


def shown_ks(samples: int) -> list[int]:
    """The k a summary line shows: every k up to 8, else 1, 2, 4, 8, ... and ``samples``."""
    if samples <= 8:
        return list(range(1, samples + 1))
    return sorted({2 ** i for i in range(samples.bit_length()) if 2 ** i <= samples} | {samples})
