"""ES iteration speed and memory, measured side by side in one run on the same model, population,
prompts and generated lengths:

    (a) full    the paper's iteration: members one after another (perturb in place, generate the
                prompts, restore), then the update
    (b) lowrank the batched low-rank iteration (--noise lowrank): every (member, prompt) pair one
                row of one generate call, then the update
    (c) ceiling one plain batched generate over the same N x P rows with the unperturbed model

    python -m benchmarks.es_speed [--population 8 32] [--max-new-tokens 48] [--rank 1] [--dtype bf16]

Every row generates exactly --max-new-tokens tokens (stop tokens are suppressed until then), so
the ratios measure the engine, not the completions. Each case runs in a fresh process (peak
memory does not mix) after a short warm-up. Printed per case: member evaluations/s, generated
tokens/s, seconds per iteration, peak memory above the loaded weights (as a fraction of their
bytes); then the ratios b/a and b/c. A last section compares one exact perturb/restore cycle
with a naive full-copy restore (memory).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import threading
import time

import torch

import llm_envs
import trainers.rollout
from trainers import es, noise
from trainers.config import build_config
from trainers.generation import generate
from trainers.models import load_model


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


@torch.no_grad()
def naive_cycle(params: noise.Params, seed: int, sigma: float) -> None:
    """The memory-hungry alternative: save every tensor, perturb, restore from the copy."""
    saved = [p.detach().clone() for p in params.tensors]
    for index, p in enumerate(params.tensors):
        p.add_(noise.noise(p, seed, index), alpha=sigma)
    for p, s in zip(params.tensors, saved):
        p.copy_(s)


def measure(case: str, args) -> dict:
    """One case in this (fresh) process."""
    es.release_freed_buffers()  # as the trainer does
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, verbose=False)
    cuda = next(model.parameters()).device.type == "cuda"
    with torch.no_grad():  # weights load memory-mapped: make them resident before the baseline
        for p in model.parameters():
            p.mul_(1.0)
    out = {"weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "threads": torch.get_num_threads(), "device": str(next(model.parameters()).device),
           "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}
    peak_of = PeakCUDA if cuda else PeakRSS
    if case in ("exact", "naive"):
        params = noise.Params(es.select_params(model, None), fp32_master=False)
        with peak_of() as peak:
            if case == "naive":
                naive_cycle(params, 1, 5e-4)
            else:
                patches = noise.perturb(params, 1, 5e-4)
                noise.restore(params, 1, 5e-4, patches)
        return {**out, "growth": peak.growth}

    env = llm_envs.make(args.env)
    scorer = llm_envs.BatchScorer(env, 0)
    batch = list(env.examples("train"))[:args.prompts]
    cfg = build_config(es.ESConfig, {"env": args.env, "population": args.population, "sigma": 5e-4, "alpha": 1e-3,
                                     "max_new_tokens": args.max_new_tokens, "score_workers": 0,
                                     "noise": "lowrank" if case == "lowrank" else "full", "rank": args.rank})
    # equal lengths: every row generates exactly max_new_tokens tokens
    trainers.rollout.generate = functools.partial(generate, min_new_tokens=args.max_new_tokens)
    params, layers = es.perturbable(model, cfg)
    rows = [e.prompt for _ in range(args.population) for e in batch]
    generate(model, tokenizer, rows[:2], max_new_tokens=4)  # warm-up

    def iteration(it: int) -> int:
        if case == "ceiling":
            return generate(model, tokenizer, rows, max_new_tokens=args.max_new_tokens, batch_size=len(rows),
                            sort=False, min_new_tokens=args.max_new_tokens).total_tokens
        seeds, signs, rewards, _, tokens = es.es_iteration(cfg, it, model, tokenizer, scorer, params, layers, batch)
        z = es.normalise(rewards)
        if z is not None:
            es.update_weights(cfg, params, layers, *es.update_coefficients(seeds, signs, z, cfg.alpha))
        return int(tokens.sum())

    tokens = 0
    with peak_of() as peak:
        start = time.perf_counter()
        for it in range(1, args.iterations + 1):
            tokens += iteration(it)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {**out, "growth": peak.growth, "seconds": seconds / args.iterations, "tokens": tokens / args.iterations}


def run_case(case: str, argv: list[str]) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.es_speed", "--case", case, *argv]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--env", default="Conciseness-v0")
    parser.add_argument("--population", type=int, nargs="+", default=[8, 32], help="N values to measure")
    parser.add_argument("--prompts", type=int, default=2, help="training prompts per member")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=1, help="measured iterations per case")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, help="fp32 / bf16 (default: fp32 on CPU, bf16 on CUDA)")
    parser.add_argument("--cases", default="ceiling,lowrank,full", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # a child process: one case, one population size; prints one JSON line
        args.population = args.population[0]
        print("RESULT " + json.dumps(measure(args.case, args)))
        return

    common = ["--model", args.model, "--env", args.env, "--prompts", str(args.prompts), "--max-new-tokens",
              str(args.max_new_tokens), "--rank", str(args.rank), "--iterations", str(args.iterations)]
    common += ["--device", args.device] if args.device else []
    common += ["--dtype", args.dtype] if args.dtype else []
    header = None
    for n in args.population:
        r = {case: run_case(case, [*common, "--population", str(n)]) for case in args.cases.split(",")}
        first = next(iter(r.values()))
        if header is None:
            header = (f"model {args.model} ({first['weight_bytes'] / 2**20:.0f} MiB of {first['dtype']} weights) on "
                      f"{first['device']}, {first['threads']} threads; env {args.env}; {args.prompts} prompts per "
                      f"member; {args.max_new_tokens} new tokens per row; low-rank R={args.rank}")
            print(header)
            print("| N x prompts | case | member evals/s | tokens/s | s/iteration | peak memory / weights |")
            print("|---|---|---:|---:|---:|---:|")
        for case in ("full", "lowrank", "ceiling"):
            if case in r:
                x = r[case]
                label = {"full": "(a) full-rank, sequential", "lowrank": "(b) low-rank, batched",
                         "ceiling": "(c) plain batched generate"}[case]
                print(f"| {n} x {args.prompts} | {label} | {n / x['seconds']:.2f} | {x['tokens'] / x['seconds']:.1f} | "
                      f"{x['seconds']:.1f} | {x['growth'] / x['weight_bytes']:.2f} |", flush=True)
        if {"full", "lowrank", "ceiling"} <= set(r):
            print(f"|  | **ratios** | **b/a = {r['full']['seconds'] / r['lowrank']['seconds']:.1f}** | "
                  f"**b/c = {r['ceiling']['seconds'] / r['lowrank']['seconds']:.2f}** | | |", flush=True)
    exact, naive = run_case("exact", common + ["--population", "2"]), run_case("naive", common + ["--population", "2"])
    w = exact["weight_bytes"]
    print(f"one perturb + restore, peak memory above the weights / weight bytes: exact (sparse patch) "
          f"{exact['growth'] / w:.2f}, naive full copy {naive['growth'] / w:.2f}")


if __name__ == "__main__":
    main()
