"""LoRA adapters against full weights, measured side by side in one run on one model and one batch:
peak memory and time of a GRPO step (full weights, adapters of rank 8 and 64), of an ES iteration
(full-rank noise, low-rank noise, adapters), and their trainable parameters and bytes per parameter;
then the population-batched generation of ES on adapters against plain generation at the same rows.

    python -m benchmarks.memory.lora                                  # the default model, CPU or CUDA
    python -m benchmarks.memory.lora --model PATH --json lora.json    # any model; results also as JSON
    python -m benchmarks.memory.lora --cases grpo_full grpo_lora8     # some of the cases
    python -m benchmarks.memory.lora --grad-accum 8 --gradient-checkpointing --cases grpo_full grpo_lora8
    python -m benchmarks.memory.lora --cases es_lora8 es_lora8_per_row plain --repeats 3   # speed ratios, interleaved

Cases (each in a fresh process, as ``peak.py``: peak memory during the step above the memory in use
before any model was loaded; on CPU the process's VmHWM, for the GRPO cases with glibc's mmap threshold
fixed, ``LIVE_MEMORY``; on CUDA ``max_memory_allocated``):

- ``grpo_full``: one GRPO step on every weight (fp32 masters, the frozen reference copy, AdamW), the
  second of the run (the GRPO cases take one step first, so AdamW's state is there, as in a run);
- ``grpo_lora8``, ``grpo_lora64``: the same step on adapters of rank 8 / 64 (the base frozen, the KL
  reference the base with adapters disabled, AdamW on the adapters only);
- ``es_full``: one ES iteration with full-rank noise, the N members one after another;
- ``es_lowrank``: one iteration with rank-1 low-rank noise, the population in one batched generation;
- ``es_lora8``: one iteration on adapters of rank 8, the population in one batched generation;
- ``es_lora8_per_row``: the same with the native engine's per-row products (each live row's member
  factors gathered per row, the layout its fixed-shape path keeps) instead of its by-member ones;
- ``plain``: one plain generation of the same N x P rows with the unperturbed model, the ceiling
  the batched ES generations are compared with (their engine seconds over its seconds).

Per case: peak MiB, the step's seconds (and its generation's alone), trainable parameters, and the
bytes per parameter of the model that the training state holds (weights, gradients, optimizer
state, fp32 masters, adapters; activations and the KV cache are in the peak only). GRPO and ES
both generate N x P = G x P responses per step (``--group-size``), greedy for ES, sampled for GRPO;
``--max-new-tokens`` tokens at most.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import time

from benchmarks.memory.peak import batch_arguments, batch_passthrough, in_fresh_processes, rss_bytes, start_peak
from trainers.common.config import Parser

CASES = ("grpo_full", "grpo_lora8", "grpo_lora64", "es_full", "es_lowrank", "es_lora8", "es_lora8_per_row", "plain")


def training_state_bytes(model, optimizer=None, params=None, reference=None) -> int:
    """Bytes of the training state: parameters (tied once), the gradients of the trainable ones (as
    they are between backward and the optimizer step), the optimizer's state, ES's fp32 masters and
    a separate reference model."""
    import torch

    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size() * (2 if p.requires_grad and optimizer is not None else 1)
    if isinstance(reference, torch.nn.Module):
        total += sum(p.numel() * p.element_size() for p in reference.parameters())
    if optimizer is not None:
        total += sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
                     if isinstance(v, torch.Tensor))
    if params is not None:
        total += sum(m.numel() * m.element_size() for m in params.masters if m is not None)
    return total


#: glibc keeps freed heap memory, so a CPU's VmHWM would count what the allocator retains; a fixed
#: mmap threshold serves every allocation of 64 KiB or more from its own mapping, returned when
#: freed, so the resident set follows the live tensors (to within ~90 MiB here; no effect on CUDA).
#: The GRPO cases only: it slows generation by 1.3-1.7x (measured), so the ES cases, whose target is
#: a speed ratio, run with the default allocator (their peaks include what it keeps).
LIVE_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def child(args) -> dict:
    """Set up and run one step of the case ``args.child`` in this process; returns its measurements."""
    import torch

    import llm_envs
    from trainers.common import adapters
    from trainers.common.models import compute_dtype, load_model
    from trainers.engines import make_engine
    from trainers.es import train as es
    from trainers.rl import policy, sampling
    from trainers.rl.grpo import GRPO, GRPOConfig

    torch.manual_seed(0)
    case = args.child
    cuda = torch.cuda.is_available() and args.device != "cpu"
    env = llm_envs.make(args.env)
    scorer = llm_envs.BatchScorer(env, 0)
    prompts = list(env.examples("train"))[:args.prompts]
    import transformers.generation.utils  # noqa: F401  (code, not data: imported before the baseline)
    import transformers.models.llama.modeling_llama  # noqa: F401

    base = rss_bytes() if not cuda else torch.cuda.memory_allocated()
    rank = int(re.search(r"lora(\d+)", case).group(1)) if "lora" in case else 0
    if case.endswith("_per_row"):  # for the rest of this process, which measures this case alone
        from benchmarks.speed.es_adapters import per_row_layout

        contextlib.ExitStack().enter_context(per_row_layout())
    optimizer = params = ref = None
    start = time.perf_counter()
    if case.startswith("grpo"):
        cfg = GRPOConfig(env=args.env, model=args.model, group_size=args.group_size, batch_size=args.prompts, beta=1e-3,
                         max_new_tokens=args.max_new_tokens, grad_accum=args.grad_accum, score_workers=0, device=args.device, lora_rank=rank,
                         engine=args.engine, dtype=args.dtype, gradient_checkpointing=args.gradient_checkpointing)
        cfg.validate()
        compute = torch.bfloat16 if args.dtype == "bf16" else None  # fp32 weights (full) computing in it
        model, tokenizer = policy.load_policy(args.model, args.device, args.gradient_checkpointing, compute, cfg, 0,
                                              args.model)
        ref = adapters.BaseOf(model) if rank else policy.load_reference(args.model, args.device, compute)
        algo = GRPO(cfg, model, tokenizer, ref)
        optimizer = policy.make_optimizer(algo.param_groups(), cfg.lr)
        engine = make_engine(args.engine, model, tokenizer, compute_dtype(model))
        trainable = sum(p.numel() for g in algo.param_groups() for p in g["params"])
    else:
        noise = {"es_full": "full", "es_lowrank": "lowrank"}.get(case, "full")
        cfg = es.ESConfig(env=args.env, model=args.model, population=args.group_size, sigma=1e-3, alpha=5e-4,
                          iterations=1, max_new_tokens=args.max_new_tokens, score_workers=0, device=args.device,
                          noise=noise, lora_rank=rank, engine=args.engine, dtype=args.dtype, mirrored=True)
        cfg.validate()
        model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
        model = es.with_adapters(model, cfg)
        params, layers = es.perturbable(model, cfg)
        engine = make_engine(args.engine, model, tokenizer, lora_members=cfg.population if rank else 0)
        trainable = 0 if case == "plain" else params.numel()
    setup_seconds = time.perf_counter() - start
    generated = {"seconds": 0.0}
    real_generate = engine.generate

    def timed(*a, **kw):  # the engine's calls alone: what the batched generation costs
        t0 = time.perf_counter()
        try:
            return real_generate(*a, **kw)
        finally:
            generated["seconds"] += time.perf_counter() - t0

    def grpo_step(seed: int) -> int:
        samples = sampling.sample(engine, scorer, prompts, cfg.group_size, cfg.max_new_tokens, 64, cfg.temperature,
                                  seed=seed)
        algo.update(algo.prepare(samples), optimizer)
        return samples.num_tokens

    if case.startswith("grpo"):  # a run's steady step: AdamW's state exists (the first step creates it after backward)
        grpo_step(1)
    engine.generate = timed
    peak = start_peak(cuda)
    start = time.perf_counter()
    if case.startswith("grpo"):
        tokens = grpo_step(0)
    elif case == "plain":
        out = engine.generate([e.prompt for _ in range(cfg.population) for e in prompts], args.max_new_tokens,
                              batch_size=cfg.population * len(prompts), sort=False)
        tokens = sum(out.num_tokens)
    else:
        seeds, signs, rewards, _, token_counts = es.es_iteration(cfg, 1, engine, scorer, params, layers, prompts)
        z = es.normalise(rewards)
        if z is not None:
            es.update_weights(cfg, params, layers, *es.update_coefficients(seeds, signs, z, cfg.alpha))
        tokens = int(token_counts.sum())
    top, _ = peak.read()
    n_params = sum(p.numel() for p in model.parameters())
    return {"case": case, "device": "cuda" if cuda else "cpu", "peak_bytes": top - base, "step_seconds":
            time.perf_counter() - start, "generate_seconds": generated["seconds"], "setup_seconds": setup_seconds,
            "parameters": n_params, "trainable": trainable, "state_bytes": training_state_bytes(model, optimizer, params, ref),
            "tokens": tokens, "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}


def report(results: dict[str, dict], args) -> list[str]:
    """The table: one line per case, then the ratios the issue set targets for."""
    mib = 2 ** 20
    first = next(iter(results.values()))
    lines = [f"model {args.model} ({first['parameters'] / 1e6:.1f}M parameters), {first['device']}, engine {args.engine}, "
             f"{args.prompts} prompts x {args.group_size} responses, <= {args.max_new_tokens} new tokens, "
             f"GRPO in {args.grad_accum} micro-batch(es){', activations checkpointed' if args.gradient_checkpointing else ''}",
             f"{'case':<13}{'peak MiB':>9}{'step s':>8}{'gen s':>7}{'trainable':>11}{'state B/param':>14}{'tokens':>8}"]
    for case, r in results.items():
        lines.append(f"{case:<13}{r['peak_bytes'] / mib:>9.0f}{r['step_seconds']:>8.1f}{r['generate_seconds']:>7.1f}"
                     f"{r['trainable'] / 1e6:>10.2f}M{r['state_bytes'] / r['parameters']:>14.2f}{r['tokens']:>8}")
    if "grpo_full" in results:
        for case in ("grpo_lora8", "grpo_lora64"):
            if case in results:
                lines.append(f"{case} peak / grpo_full peak = {results[case]['peak_bytes'] / results['grpo_full']['peak_bytes']:.2f} "
                             f"(target for rank 8: <= 0.5)")
    if "plain" in results:
        for case in ("es_lora8", "es_lora8_per_row", "es_lowrank"):
            if case in results:
                each = [speed_ratio(r, p) for r, p in zip(results[case]["repeats"], results["plain"]["repeats"])]
                lines.append(f"{case} batched generation speed / plain generation at the same rows = "
                             f"{statistics.median(each):.2f} (tokens/s over tokens/s; target for es_lora8: >= 0.85)"
                             + (f"; median of {len(each)} interleaved repeats: {', '.join(f'{x:.2f}' for x in each)}"
                                if len(each) > 1 else ""))
    return lines


def speed_ratio(case: dict, plain: dict) -> float:
    """A batched ES generation's tokens/s over plain generation's, at the same rows."""
    return (plain["generate_seconds"] / case["generate_seconds"]) * (case["tokens"] / max(1, plain["tokens"]))


def medians(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Each case's result with its times the median over ``rounds`` (and every round's under ``repeats``)."""
    out = {}
    for case in rounds[0]:
        each = [r[case] for r in rounds]
        out[case] = {**each[0], **{k: statistics.median(x[k] for x in each) for k in ("step_seconds", "generate_seconds")},
                     "peak_bytes": max(x["peak_bytes"] for x in each), "repeats": each}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    batch_arguments(parser, 16, CASES)
    parser.add_argument("--engine", default="auto", help="generation engine of every case (default auto)")
    parser.add_argument("--dtype", default="fp32", help="ES's and plain generation's dtype (default fp32; GRPO: fp32 "
                                                        "weights, this compute dtype on CUDA)")
    parser.add_argument("--grad-accum", type=int, default=1, help="GRPO's micro-batches per step (default 1: the whole "
                                                                  "batch in one, activations the largest)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="GRPO recomputes its activations in the backward pass (every GRPO case alike)")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="which cases (default: all)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the ES and plain cases this many times, interleaved (times: medians; the speed "
                             "ratios of each repeat printed): one run moves the ratios by ~0.1 on a 2-core CPU")
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    passthrough = [*batch_passthrough(args), "--engine", args.engine, "--dtype", args.dtype, "--grad-accum",
                   str(args.grad_accum), *(["--gradient-checkpointing"] if args.gradient_checkpointing else [])]
    # GRPO's question is memory: its cases run with LIVE_MEMORY; ES's is speed, and mmap-served
    # allocations (a page fault per fresh page) would slow generation: the default allocator
    grpo = [c for c in args.cases if c.startswith("grpo")]
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    rest = [c for c in args.cases if c not in grpo]
    rounds = [in_fresh_processes("benchmarks.memory.lora", passthrough, rest) for _ in range(args.repeats)]
    measured = {**medians([in_fresh_processes("benchmarks.memory.lora", passthrough, grpo, LIVE_MEMORY)]),
                **(medians(rounds) if rest else {})}
    results = {case: measured[case] for case in args.cases}
    print("\n".join(report(results, args)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"}, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
