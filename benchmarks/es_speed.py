"""ES iteration speed and memory on the default model (or any --model), measured in one run.

    python -m benchmarks.es_speed [--env Conciseness-v0] [--population 4] [--max-new-tokens 32]

Prints seconds per iteration split into generation and noise work (perturb + exact restore +
update), generated tokens per second, and peak memory above the loaded model as a fraction of
the model's weight bytes: ours (sparse restore patch, one tensor-sized noise buffer) next to a
naive restore that keeps a full copy of the weights, both measured here, side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import psutil
import torch

import llm_envs
from trainers import es, noise
from trainers.config import build_config
from trainers.models import load_model
from trainers.rollout import rollout


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled every 5 ms)."""

    def __enter__(self):
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


@torch.no_grad()
def naive_cycle(params, seed: int, sigma: float) -> None:
    """The memory-hungry alternative: save every tensor, perturb, restore from the copy."""
    saved = [p.detach().clone() for _, p in params]
    for index, (_, p) in enumerate(params):
        p.add_(noise.noise(p, seed, index), alpha=sigma)
    for (_, p), s in zip(params, saved):
        p.copy_(s)


def measure(case: str, args) -> dict:
    """One case in this (fresh) process: 'es' iterations, or one 'exact' / 'naive' cycle."""
    es.release_freed_buffers()  # as the trainer does
    model, tokenizer = load_model(args.model, verbose=False)
    params = es.select_params(model, None)
    with torch.no_grad():  # weights load memory-mapped: make them resident before the baseline
        for _, p in params:
            p.mul_(1.0)
    out = {"weight_bytes": sum(p.numel() * p.element_size() for _, p in params), "threads": torch.get_num_threads()}
    if case == "naive":
        with PeakRSS() as peak:
            naive_cycle(params, 1, 5e-4)
        return {**out, "growth": peak.growth}
    if case == "exact":
        with PeakRSS() as peak:
            patches = noise.perturb(params, 1, 5e-4)
            noise.restore(params, 1, 5e-4, patches)
        return {**out, "growth": peak.growth, "patch_fraction": sum(p.numel for p in patches) / sum(p.numel() for _, p in params)}
    env = llm_envs.make(args.env)
    cfg = build_config(es.ESConfig, {"env": args.env, "population": args.population, "sigma": 5e-4,
                                        "alpha": 1e-3, "max_new_tokens": args.max_new_tokens, "score_workers": 0})
    batch = list(env.examples("train"))
    scorer = llm_envs.BatchScorer(env, 0)
    rollout(model, tokenizer, scorer, batch, args.max_new_tokens)  # warm-up
    gen_seconds, tokens = 0.0, 0
    real_rollout = es.rollout

    def timed_rollout(*a, **k):
        nonlocal gen_seconds, tokens
        r = real_rollout(*a, **k)
        gen_seconds += r.seconds
        tokens += sum(r.num_tokens)
        return r

    es.rollout = timed_rollout
    with PeakRSS() as peak:
        start = time.perf_counter()
        for it in range(1, args.iterations + 1):
            seeds, signs, rewards, _, _ = es.es_iteration(cfg, it, model, tokenizer, scorer, params, batch)
            z = es.normalise(rewards)
            if z is not None:
                noise.apply_update(params, *es.update_coefficients(seeds, signs, z, cfg.alpha))
        seconds = time.perf_counter() - start
    es.rollout = real_rollout
    return {**out, "growth": peak.growth, "seconds": seconds / args.iterations, "prompts": len(batch),
            "generation": gen_seconds / args.iterations, "tokens": tokens / args.iterations,
            "tokens_per_s": tokens / gen_seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--env", default="Conciseness-v0")
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--case", choices=["es", "exact", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # a child process: print one JSON line
        print("RESULT " + json.dumps(measure(args.case, args)))
        return

    results = {}
    for case in ("es", "exact", "naive"):  # each in a fresh process: RSS peaks do not mix
        cmd = [sys.executable, "-m", "benchmarks.es_speed", "--case", case, *(argv if argv is not None else sys.argv[1:])]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"case {case} failed:\n{done.stderr[-2000:]}")
        results[case] = json.loads(done.stdout.split("RESULT ", 1)[1])
    r, w = results["es"], results["es"]["weight_bytes"]
    print(f"model {args.model}: {w / 2**20:.0f} MiB of weights, {r['threads']} threads; env {args.env}, "
          f"{r['prompts']} prompts, N={args.population}, max_new_tokens={args.max_new_tokens}")
    print(f"seconds per iteration: {r['seconds']:.1f} (generation {r['generation']:.1f}, "
          f"perturb/restore/update {r['seconds'] - r['generation']:.1f})")
    print(f"generation: {r['tokens_per_s']:.1f} tokens/s ({r['tokens']:.0f} tokens per iteration)")
    print("peak memory above the loaded model / weight bytes:")
    print(f"  ES iteration (generation included):          {r['growth'] / w:.3f}")
    print(f"  perturb + exact restore (sparse patch):      {results['exact']['growth'] / w:.3f}"
          f"   (patch holds {results['exact']['patch_fraction']:.2%} of the weights)")
    print(f"  perturb + restore from a full copy (naive):  {results['naive']['growth'] / w:.3f}")


if __name__ == "__main__":
    main()
