"""ES iteration speed and memory, measured side by side in one run on the same model, population,
prompts and generated lengths, for each generation engine (``--engine hf native vllm``):

    (a) full     the paper's iteration: members one after another (perturb, generate the prompts,
                 restore), then the update
    (b) lowrank  the batched low-rank iteration (--noise lowrank): every (member, prompt) pair one
                 row of one engine call, then the update
    (c) ceiling  one plain batched generate over the same N x P rows with the unperturbed model
    (d) member   one full-rank member over --member-prompts prompts (the paper's shape: one member,
                 a large prompt batch), perturbation and restore included
    (b') lora    vLLM only: the low-rank iteration through vLLM's multi-LoRA, each member a rank-R
                 adapter whose product is sigma * E_n (the public route; --lora)

    python -m benchmarks.speed.es [--engine hf native vllm] [--population 8 32] [--prompts 8] [--natural] [--limit]
    python -m benchmarks.speed.es --random-init qwen2.5-1.5b --dtype bf16   # a paper model's shapes
    python -m benchmarks.speed.es --dtype fp32 bf16 --population 32        # fp32 against bf16, side by side

Every row generates exactly --max-new-tokens tokens (stop tokens are suppressed until then), so
the ratios measure the engines, not the completions; with --natural rows stop at their stop token,
as in training (an engine that drops finished rows gains there). Each case runs in a fresh process
(peak memory does not mix) after a short warm-up. Printed per case: member evaluations/s, generated
tokens/s, seconds (the whole case and its engine calls alone), peak memory above the loaded weights
(as a fraction of their bytes) and, for vLLM, the memory its engine took at start; with --limit,
the share of the matrix-product limit the generation reached (``matmul_limit``); then each
engine's speed over HF's per case and b/a, b/c per engine. ``--random-init NAME`` times the
architecture of a paper model (``configs/arch/NAME.json``) with random weights: timings do not
depend on the weights, and no model hub is needed (prompts are tokenized with the default model's
tokenizer). A last section compares one exact perturb/restore
cycle with a naive full-copy restore (memory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

import llm_envs
from trainers.es import train as es
from trainers.common.config import Parser, build_config
from trainers.common.precision import header_line
from trainers.common.models import DEFAULT_MODEL, load_model, load_tokenizer, resolve_device, resolve_dtype
from trainers.engines import ENGINES, EngineOptions, make_engine, vllm_missing
from trainers.es.noise import fullrank, lowrank
from trainers.es.noise.members import FullRankMember

ARCH_DIR = Path(__file__).resolve().parents[1] / "configs" / "arch"
CASES = {"full": "(a) full-rank, sequential", "lowrank": "(b) low-rank, batched", "lora": "(b') low-rank, vLLM multi-LoRA",
         "ceiling": "(c) plain batched generate", "member": "(d) one full-rank member"}


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled every 5 ms)."""

    def __enter__(self):
        import psutil

        self._proc, self._stop, self.peak = psutil.Process(), threading.Event(), 0
        self.start = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


class PeakCUDA:
    """Peak allocated CUDA memory above what was allocated when the block started."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.start = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.growth = torch.cuda.max_memory_allocated() - self.start


def memory_in_use(cuda: bool) -> int:
    """Bytes in use now: this process's resident memory, or the device's used memory (which
    counts what vLLM allocates outside torch's allocator too)."""
    if cuda:
        free, total = torch.cuda.mem_get_info()
        return total - free
    import psutil

    return psutil.Process().memory_info().rss


@torch.no_grad()
def naive_cycle(params: fullrank.Params, seed: int, sigma: float) -> None:
    """The memory-hungry alternative: save every tensor, perturb, restore from the copy."""
    saved = [p.detach().clone() for p in params.tensors]
    for index, p in enumerate(params.tensors):
        p.add_(fullrank.noise(p, seed, index), alpha=sigma)
    for p, s in zip(params.tensors, saved):
        p.copy_(s)


def load(args):
    """(model, tokenizer): ``--model``, or ``--random-init NAME``'s architecture with random weights."""
    if not args.random_init:
        return load_model(args.model, device=args.device, dtype=args.dtype, verbose=False)
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = json.loads((ARCH_DIR / f"{args.random_init}.json").read_text())
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    device = resolve_device(args.device)
    tokenizer = load_tokenizer(DEFAULT_MODEL)  # its ids fit every paper model's vocabulary
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(args.dtype, device, config))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def prompts_of(env, count: int) -> list:
    """``count`` prompts of the env, train first, repeating when it has fewer."""
    pool = list(env.examples("train")) + list(env.examples("test"))
    return [pool[i % len(pool)] for i in range(count)]


def measure(case: str, args) -> dict:
    """One case on one engine in this (fresh) process."""
    es.release_freed_buffers()  # as the trainer does
    model, tokenizer = load(args)
    cuda = next(model.parameters()).device.type == "cuda"
    with torch.no_grad():  # weights load memory-mapped: make them resident before the baseline
        for p in model.parameters():
            p.mul_(1.0)
    out = {"weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "threads": torch.get_num_threads(), "device": str(next(model.parameters()).device),
           "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
           "params": sum(p.numel() for p in model.parameters()),
           "machine": header_line(next(model.parameters()).device, model)}
    peak_of = PeakCUDA if cuda else PeakRSS
    if case in ("exact", "naive"):
        params = fullrank.Params(es.select_params(model, None), fp32_master=False)
        with peak_of() as peak:
            if case == "naive":
                naive_cycle(params, 1, 5e-4)
            else:
                patches = fullrank.perturb(params, 1, 5e-4)
                fullrank.restore(params, 1, 5e-4, patches)
        return {**out, "growth": peak.growth}

    env = llm_envs.make(args.env)
    scorer = llm_envs.BatchScorer(env, 0)
    batch = prompts_of(env, args.prompts)
    cfg = build_config(es.ESConfig, {"env": args.env, "population": args.population, "sigma": 5e-4, "alpha": 1e-3,
                                     "max_new_tokens": args.max_new_tokens, "score_workers": 0, "engine": args.engine,
                                     "noise": "lowrank" if case in ("lowrank", "lora") else "full", "rank": args.rank})
    params, layers = es.perturbable(model, cfg)
    before = memory_in_use(cuda)
    engine = make_engine(cfg, model, tokenizer) if case != "lora" else lora_engine(model, tokenizer, args)
    out["engine_bytes"] = memory_in_use(cuda) - before
    calls = record_calls(engine, 0 if args.natural else args.max_new_tokens)  # forced: exactly max_new_tokens each
    rows = [e.prompt for _ in range(args.population) for e in batch]
    engine.generate(rows[:2], max_new_tokens=4)  # warm-up
    calls.clear()
    member_rows = [e.prompt for e in prompts_of(env, args.member_prompts)]

    def iteration(it: int) -> int:
        if case == "ceiling":
            return engine.generate(rows, args.max_new_tokens, batch_size=len(rows), sort=False).total_tokens
        if case == "member":
            member = FullRankMember(params, fullrank.member_seed(0, it, 0), cfg.sigma)
            return engine.generate(member_rows, args.max_new_tokens, batch_size=len(member_rows),
                                   perturbation=member).total_tokens
        if case == "lora":
            seeds, signs, rewards, tokens = lora_population(engine, cfg, layers, batch, scorer, it, args)
        else:
            seeds, signs, rewards, _, tokens = es.es_iteration(cfg, it, engine, scorer, params, layers, batch)
        z = es.normalise(rewards)
        if z is not None:
            es.update_weights(cfg, params, layers, *es.update_coefficients(seeds, signs, z, cfg.alpha))
            engine.sync_weights()
        return int(tokens.sum())

    for it in range(1, args.warmup + 1):  # untimed (CUDA graphs are captured at first use)
        iteration(it)
    calls.clear()
    tokens = 0
    with peak_of() as peak:
        start = time.perf_counter()
        for it in range(args.warmup + 1, args.warmup + args.iterations + 1):
            tokens += iteration(it)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    engine.close()
    members = 1 if case == "member" else args.population
    out.update(growth=peak.growth, seconds=seconds / args.iterations, tokens=tokens / args.iterations, members=members,
               generation_seconds=sum(c.seconds for c in calls) / args.iterations)
    if args.limit and case in ("lowrank", "ceiling"):
        out["limit_seconds"] = sum(matmul_limit(model, c) for c in calls) / args.iterations
    return out


def record_calls(engine, min_new_tokens: int) -> list:
    """Make every ``engine.generate`` call use ``min_new_tokens`` and keep its result."""
    calls, generate = [], engine.generate

    def recorded(*a, **kw):
        calls.append(generate(*a, **{**kw, "min_new_tokens": min_new_tokens}))
        return calls[-1]

    engine.generate = recorded
    return calls


@torch.inference_mode()
def matmul_limit(model, result) -> float:
    """Seconds the matrix products of ``result``'s work take alone, as ``ENGINE_NOTES.md`` measures
    them: every linear layer called in turn on an (M, d) input, for the prefill of every prompt token
    (M = all prompt tokens; the output head for the last token of each row) and for every decode step
    (M = the rows still generating at that step). Each product in the faster of its two layouts
    (``x W^T`` or ``W x^T``). A measure of the work a completion needs, not of how an engine batches it:
    padding and finished rows kept in the batch are not counted."""
    rows, lengths = len(result.num_tokens), sorted(result.num_tokens, reverse=True)
    live = [sum(n > step for n in lengths) for step in range(1, max(lengths))]  # rows fed back at each step
    seconds = _products(model, sum(result.prompt_tokens), head_rows=rows)
    timed: dict[int, float] = {}
    for m in live:
        if m not in timed:
            timed[m] = _products(model, m, head_rows=m)
        seconds += timed[m]
    return seconds


def _products(model, m: int, head_rows: int) -> float:
    """Seconds of every block linear on (m, d_in) plus the head on (head_rows, d), fastest layout, best of 2."""
    head = model.get_output_embeddings()
    linears = [x for x in model.modules() if isinstance(x, torch.nn.Linear) and x is not head]
    device, dtype = head.weight.device, head.weight.dtype
    inputs = {n: torch.randn(m, n, device=device, dtype=dtype) for n in {x.in_features for x in linears + [head]}}

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(2):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        return best

    def run(layers, rows, transposed):
        for x in layers:
            a = inputs[x.in_features][:rows]
            (x.weight @ a.T) if transposed else torch.nn.functional.linear(a, x.weight)

    total = 0.0
    for layers, rows in ((linears, m), ([head], head_rows)):
        total += min(timed(lambda: run(layers, rows, t)) for t in (False, True))
    return total


# ----- the multi-LoRA route (measured, not shipped: see docs/benchmarks.md) -----------------------------


def lora_engine(model, tokenizer, args):
    """A vLLM engine with multi-LoRA on: one adapter slot per member."""
    from trainers.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model, tokenizer, EngineOptions(engine="vllm"), enable_lora=True, max_loras=args.population,
                      max_lora_rank=max(8, args.rank))


def write_adapter(path: Path, layers, seed: int, sign: float, sigma: float, rank: int) -> None:
    """Member ``seed`` as a PEFT LoRA adapter: lora_B @ lora_A = sign * sigma * A B^T / sqrt(R)."""
    from trainers.engines.vllm_adapters import write_lora_adapter

    factors = {}
    for i, layer in enumerate(layers):
        a, b = lowrank.factors(layer, i, seed, rank)
        factors[f"base_model.model.{layer.name.removesuffix('.weight')}"] = (b.T, sign * sigma / rank ** 0.5 * a)
    write_lora_adapter(path, factors, rank)


def lora_population(engine, cfg, layers, batch, scorer, iteration: int, args):
    """One population through multi-LoRA: adapters written (to /dev/shm where it exists), every
    (member, prompt) row in one call with its member's adapter, scored per member."""
    from vllm.lora.request import LoRARequest

    seeds, signs = es.population(cfg, iteration)
    root = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    requests = []
    for n, (seed, sign) in enumerate(zip(seeds, signs)):
        write_adapter(root / f"m{n}", layers, seed, sign, cfg.sigma, cfg.rank)
        requests.append(LoRARequest(f"i{iteration}m{n}", iteration * 10_000 + n + 1, str(root / f"m{n}")))
    P = len(batch)
    out = engine.generate_with_adapters([e.prompt for _ in seeds for e in batch], args.max_new_tokens,
                                        [requests[k // P] for k in range(len(seeds) * P)])
    scores = scorer.score_batch(out.texts, [e for _ in seeds for e in batch])
    rewards = np.array([np.mean([s.reward for s in scores[n * P:(n + 1) * P]]) for n in range(len(seeds))])
    tokens = np.array([sum(out.num_tokens[n * P:(n + 1) * P]) for n in range(len(seeds))])
    return seeds, signs, rewards, tokens


# ----- the parent: one child process per case --------------------------------------------------------


def run_case(case: str, argv: list[str]) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.speed.es", "--case", case, *argv]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def parse(argv: list[str] | None):
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    installed = ["hf", "native", *["vllm"] * (vllm_missing() is None)]
    parser.add_argument("--engine", nargs="+", default=installed, choices=ENGINES,
                        help="engines to measure side by side (default: every installed one)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--random-init", choices=sorted(p.stem for p in ARCH_DIR.glob("*.json")),
                        help="time this paper model's architecture with random weights instead of --model")
    parser.add_argument("--env", default="Conciseness-v0")
    parser.add_argument("--population", type=int, nargs="+", default=[8, 32], help="N values to measure")
    parser.add_argument("--prompts", type=int, default=8, help="training prompts per member")
    parser.add_argument("--member-prompts", type=int, default=64, help="prompts of case (d), one member")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--natural", action="store_true",
                        help="rows stop at their stop token (natural lengths); default: every row generates exactly "
                             "--max-new-tokens")
    parser.add_argument("--limit", action="store_true",
                        help="also time the matrix products of (b) and (c)'s work alone, and print the share of that "
                             "limit each engine's generation reached")
    parser.add_argument("--iterations", type=int, default=1, help="measured iterations per case")
    parser.add_argument("--warmup", type=int, default=0, help="untimed iterations before them")
    parser.add_argument("--cases", default="full,lowrank,ceiling,member",
                        help="comma-separated subset of full, lowrank, ceiling, member, lora (lora: vLLM only)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", nargs="+", default=["auto"], choices=["auto", "fp32", "bf16"],
                        help="weight dtypes to measure side by side (each case alternates them, ABBA); auto: bf16 on "
                             "CUDA and on a CPU with bf16 matrix units, fp32 elsewhere; bf16 keeps fp32 masters")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--cases: unknown {', '.join(sorted(unknown))}; known: {', '.join(CASES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.case:  # a child process: one case, engine, population size and dtype; prints one JSON line
        args.population, args.engine, args.dtype = args.population[0], args.engine[0], args.dtype[0]
        print("RESULT " + json.dumps(measure(args.case, args)))
        return

    common = ["--natural"] * args.natural + ["--limit"] * args.limit
    common += ["--env", args.env, "--prompts", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
              "--rank", str(args.rank), "--iterations", str(args.iterations), "--warmup", str(args.warmup),
              "--member-prompts", str(args.member_prompts)]
    common += ["--random-init", args.random_init] if args.random_init else ["--model", args.model]
    common += ["--device", args.device] if args.device else []
    cases = [c for c in CASES if c in args.cases.split(",")]
    header = None
    for n in args.population:
        r, flip = {}, False
        for case in cases:
            for engine in args.engine:
                if case == "lora" and engine != "vllm":
                    continue
                for dtype in (args.dtype[::-1] if flip else args.dtype):  # ABBA: neither dtype always runs first
                    r[case, engine, dtype] = run_case(case, [*common, "--population", str(n), "--engine", engine,
                                                             "--dtype", dtype])
                flip = not flip
        first = next(iter(r.values()))
        if header is None:
            header = (f"model {args.random_init or args.model}{' (random weights)' if args.random_init else ''} "
                      f"({first['params'] / 1e6:.1f}M parameters) on {first['device']}, {first['machine']}; "
                      f"env {args.env}; {args.prompts} prompts per member, (d) "
                      f"{args.member_prompts}; "
                      f"{'up to' if args.natural else 'exactly'} {args.max_new_tokens} new tokens per row "
                      f"({'natural' if args.natural else 'forced'} lengths); low-rank R={args.rank}")
            print(header)
            print("| N x prompts | case | engine | dtype | member evals/s | tokens/s | s | generation s | share of the "
                  "matmul limit | peak memory / weights | engine memory / weights |")
            print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for (case, engine, _), x in r.items():
            shape = f"1 x {args.member_prompts}" if case == "member" else f"{n} x {args.prompts}"
            share = f"{x['limit_seconds'] / x['generation_seconds']:.0%}" if "limit_seconds" in x else ""
            print(f"| {shape} | {CASES[case]} | {engine} | {x['dtype']} | {x['members'] / x['seconds']:.2f} | "
                  f"{x['tokens'] / x['seconds']:.1f} | {x['seconds']:.1f} | {x['generation_seconds']:.1f} | {share} | "
                  f"{x['growth'] / x['weight_bytes']:.2f} | {x['engine_bytes'] / x['weight_bytes']:.2f} |", flush=True)
        for dtype in args.dtype:
            print(f"ratios ({dtype}): " + ratios({(c, e): x for (c, e, d), x in r.items() if d == dtype}), flush=True)
        if len(args.dtype) == 2:
            print(dtype_ratios(r, *args.dtype), flush=True)
    if "hf" in args.engine:
        exact, naive = (run_case(c, [*common, "--population", "2", "--engine", "hf", "--dtype", args.dtype[0]])
                        for c in ("exact", "naive"))
        w = exact["weight_bytes"]
        print(f"one perturb + restore, peak memory above the weights / weight bytes: exact (sparse patch) "
              f"{exact['growth'] / w:.2f}, naive full copy {naive['growth'] / w:.2f}")


def ratios(r: dict) -> str:
    """Each engine's speed over HF's per case (HF seconds / its seconds), and b/a, b/c per engine."""
    parts = []
    for case in CASES:
        for engine in ENGINES[1:]:
            if (case, "hf") in r and (case, engine) in r:
                parts.append(f"{CASES[case].split()[0]} {engine}/hf = "
                             f"{r[case, 'hf']['seconds'] / r[case, engine]['seconds']:.2f}")
    for engine in ENGINES:
        if {("full", engine), ("lowrank", engine)} <= set(r):
            parts.append(f"{engine} b/a = {r['full', engine]['seconds'] / r['lowrank', engine]['seconds']:.1f}")
        if {("ceiling", engine), ("lowrank", engine)} <= set(r):
            parts.append(f"{engine} b/c = {r['ceiling', engine]['seconds'] / r['lowrank', engine]['seconds']:.2f}")
    if ("lora", "vllm") in r and ("lowrank", "vllm") in r:
        parts.append(f"multi-LoRA / hooks = {r['lowrank', 'vllm']['seconds'] / r['lora', 'vllm']['seconds']:.2f}")
    return "; ".join(parts)


def dtype_ratios(r: dict, a: str, b: str) -> str:
    """Per case and engine: the iteration's and the generation's speed in ``b`` over ``a``."""
    parts = [f"{CASES[case].split()[0]} {engine}: {x['seconds'] / r[case, engine, b]['seconds']:.2f} "
             f"(generation {x['generation_seconds'] / r[case, engine, b]['generation_seconds']:.2f})"
             for (case, engine, dtype), x in r.items() if dtype == a and (case, engine, b) in r]
    return f"{b} over {a}, speed of the whole case (its generation alone): " + "; ".join(parts)


if __name__ == "__main__":
    main()
