"""ES on LoRA adapters: the population's batched generation against plain generation of the same
rows, interleaved in one process (issue 57's target: >= 0.85x plain generation's tokens/s).

    python -m benchmarks.speed.es_adapters                          # the default model, native engine, 5 rounds
    python -m benchmarks.speed.es_adapters --rounds 9 --population 32 --prompts 1
    python -m benchmarks.speed.es_adapters --engine vllm            # members as LoRARequests (no per-row case)

One engine serves every case but plain (a second copy of the base model without adapters). A round
times each case once, in turn, so that a drift of the machine's speed (a 2-core VM's moves a single
run's ratio by ~0.1) touches every case alike; the ratios are each round's case over the same
round's plain generation, and their median is the result. Every row generates exactly
``--max-new-tokens`` tokens (stop tokens are suppressed until then), so the cases decode the same
tokens, and no row leaves the batch early (in training, rows stop at their stop token). Cases:

- ``plain``: the base model without adapters (vllm: the same engine, no ``LoRARequest``);
- ``population``: the population of N members on rank-R adapters in one call, N x P rows (native:
  the live rows laid out by member, each member's factors read once per product; vllm: one
  ``LoRARequest`` per member);
- ``per_row`` (native only): the same with every live row's member factors gathered per row, the
  layout of the fixed-shape (CUDA graph) path.
"""

from __future__ import annotations

import contextlib
import statistics
import time


@contextlib.contextmanager
def per_row_layout():
    """The native engine's by-member layout never chosen, for the ``per_row`` case."""
    from trainers.engines.native import rows

    real = rows._ByMember.of
    rows._ByMember.of = staticmethod(lambda members, population: None)
    try:
        yield
    finally:
        rows._ByMember.of = real


def main(argv: list[str] | None = None) -> None:
    from trainers.common.cli import Parser

    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--env", default="Countdown-v0", help="env whose train prompts the rows take")
    parser.add_argument("--engine", default="native", choices=("native", "hf", "vllm"))
    parser.add_argument("--population", type=int, default=16, help="N members (mirrored pairs)")
    parser.add_argument("--prompts", type=int, default=2, help="P prompts per member")
    parser.add_argument("--rank", type=int, default=8, help="adapter rank R")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.population < 2 or args.population % 2 or args.prompts < 1 or args.rank < 1:
        parser.error("--rounds >= 1, --population even and >= 2, --prompts >= 1 and --rank >= 1 are needed")

    import torch

    import llm_envs
    from trainers.common.hardware import machine_line
    from trainers.common.models import load_model
    from trainers.engines import make_engine
    from trainers.es import train as es
    from trainers.es.noise.members import AdapterMembers

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    env = llm_envs.make(args.env)
    prompts = [e.prompt for e in list(env.examples("train"))[:args.prompts]]
    cfg = es.ESConfig(env=args.env, model=args.model, population=args.population, sigma=7e-3, alpha=1e-2,
                      lora_rank=args.rank, engine=args.engine, dtype=args.dtype, device=device, mirrored=True)
    cfg.validate()
    model, tokenizer = load_model(args.model, device=device, dtype=args.dtype)
    model = es.with_adapters(model, cfg)
    params, layers = es.perturbable(model, cfg)
    engine = make_engine(args.engine, model, tokenizer, lora_members=args.population)
    half = args.population // 2
    seeds = [s for s in range(1, half + 1) for _ in (0, 1)]
    signs = [1.0, -1.0] * half
    adapters = AdapterMembers(params, layers, seeds, signs, cfg.sigma)
    rows = [p for _ in range(args.population) for p in prompts]
    cases = {"plain": None, "population": adapters, **({"per_row": adapters} if args.engine == "native" else {})}
    engines = {case: engine for case in cases}
    if args.engine != "vllm":  # plain: the model without adapters (vllm's call without a LoRARequest is that)
        base, _ = load_model(args.model, device=device, dtype=args.dtype)
        engines["plain"] = make_engine(args.engine, base, tokenizer)

    def once(case: str) -> tuple[float, int]:
        with per_row_layout() if case == "per_row" else contextlib.nullcontext():
            start = time.perf_counter()
            out = engines[case].generate(rows, args.max_new_tokens, batch_size=len(rows), sort=False,
                                         min_new_tokens=args.max_new_tokens, perturbation=cases[case])
            return time.perf_counter() - start, sum(out.num_tokens)

    print(f"{machine_line(device)}; model {args.model}, engine "
          f"{args.engine}, {args.dtype}, N={args.population} x {args.prompts} prompts = {len(rows)} rows, rank "
          f"{args.rank}, {args.max_new_tokens} tokens per row, {args.rounds} rounds", flush=True)
    for case in cases:  # warm-up: each case's first call pays for allocations and kernel choices
        once(case)
    seconds: dict[str, list[float]] = {c: [] for c in cases}
    tokens: dict[str, int] = {}
    for r in range(args.rounds):
        for case in cases:
            s, tokens[case] = once(case)
            seconds[case].append(s)
        print(f"round {r + 1}: " + ", ".join(f"{c} {seconds[c][-1]:.2f} s" for c in cases), flush=True)
    plain = seconds["plain"]
    for case in cases:
        tps = [tokens[case] / s for s in seconds[case]]
        line = f"{case:<10} median {statistics.median(seconds[case]):.2f} s, {statistics.median(tps):,.0f} tokens/s"
        if case != "plain":
            ratios = [(tokens[case] / s) / (tokens["plain"] / p) for s, p in zip(seconds[case], plain)]
            line += (f"; speed / plain generation = {statistics.median(ratios):.2f} (median; per round "
                     f"{', '.join(f'{x:.2f}' for x in ratios)})" + ("; target >= 0.85" if case == "population" else ""))
        print(line, flush=True)


if __name__ == "__main__":
    main()
