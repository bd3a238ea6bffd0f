"""Peak memory of one GRPO step and one PPO step next to one ES iteration, on the same model and
the same batch of prompts, as ratios measured in one run.

    python -m benchmarks.memory.peak                                   # default model, CPU or CUDA
    python -m benchmarks.memory.peak --model PATH --prompts 4 --max-new-tokens 64 --json mem.json

Each measurement runs in a fresh process: import, note the memory in use, set the algorithm up
(load the model, and for RL the frozen reference model and the AdamW optimizer), reset the peak,
run one step, read the peak. Reported is the peak during the step above the memory in use before
any model was loaded: weights, reference model, gradients, optimizer state, activations, KV cache.

- ES: one iteration of ``trainers.es`` (N members: perturb in place, greedy rollout of the
  batch, restore; then the in-place update), with population N = group size G, so both
  algorithms generate the same number of responses per step;
- GRPO: ``trainers.grpo`` (G samples per prompt, reference log-probs, one AdamW step, beta 1e-3);
- PPO: ``trainers.ppo`` (the same, plus its separate critic: a second trainable copy of the model's
  trunk with a value head, and its AdamW state; ``--shared-critic`` measures the value head on the
  policy's trunk instead), G responses per prompt.

On CPU the peak is the process's peak resident set (VmHWM, reset through /proc/self/clear_refs;
where that is not possible, RSS sampled every millisecond by a thread); on CUDA it is
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from trainers.common.config import Parser

ALGORITHMS = ("es", "grpo", "ppo")


# ----- measuring ----------------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class CpuPeak:
    """Peak RSS from the point ``reset`` is called."""

    def reset(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            self.sampler = None
        except OSError:
            import psutil

            proc, self.peak_sampled, self.stop = psutil.Process(), rss_bytes(), threading.Event()

            def sample():
                while not self.stop.is_set():
                    self.peak_sampled = max(self.peak_sampled, proc.memory_info().rss)
                    time.sleep(0.001)

            self.sampler = threading.Thread(target=sample, daemon=True)
            self.sampler.start()

    def read(self) -> tuple[int, str]:
        if self.sampler is None:
            with open("/proc/self/status") as f:
                hwm = next(line for line in f if line.startswith("VmHWM:"))
            return int(hwm.split()[1]) * 1024, "VmHWM"
        self.stop.set()
        self.sampler.join()
        return max(self.peak_sampled, rss_bytes()), "sampled RSS"


def start_peak(cuda: bool):
    """Reset the peak (CUDA's allocator's, or this process's resident set) and return what reads it:
    ``.read()`` -> (peak bytes, how it was measured)."""
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return CudaPeak()
    peak = CpuPeak()
    peak.reset()
    return peak


class CudaPeak:
    def read(self) -> tuple[int, str]:
        import torch

        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"


def child(args) -> dict:
    """Set up and run one step of ``args.child`` in this process; returns the measurements."""
    import torch

    import llm_envs
    from trainers.es import train as es
    from trainers.common.models import compute_dtype, load_model
    from trainers.engines import make_engine
    from trainers.rl.grpo import GRPO, GRPOConfig
    from trainers.rl.ppo import PPO, PPOConfig
    from trainers.rl import policy, sampling

    torch.manual_seed(0)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    env = llm_envs.make(args.env)
    scorer = llm_envs.BatchScorer(env, 0)
    prompts = list(env.examples("train"))[:args.prompts]
    # Code that loading would import lazily is imported before the baseline (the default model is a
    # Llama), so that the baseline holds code only and the peak the algorithm's data.
    import transformers.generation.utils  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    base = rss_bytes() if not cuda else torch.cuda.memory_allocated()

    # ----- set up (not measured as the step) -----
    start = time.perf_counter()
    if args.child == "es":
        cfg = es.ESConfig(env=args.env, model=args.model, population=args.group_size, sigma=1e-3, alpha=5e-4,
                          iterations=1, max_new_tokens=args.max_new_tokens, gen_batch_size=args.gen_batch_size,
                          score_workers=0, device=args.device)
        cfg.validate()
        model, tokenizer = load_model(args.model, device=args.device)
        params, layers = es.perturbable(model, cfg)
        engine = make_engine("hf", model, tokenizer)
    else:
        Config, Algo = (GRPOConfig, GRPO) if args.child == "grpo" else (PPOConfig, PPO)
        cfg = Config(env=args.env, model=args.model, group_size=args.group_size, batch_size=args.prompts, beta=1e-3,
                     max_new_tokens=args.max_new_tokens, gen_batch_size=args.gen_batch_size, score_workers=0,
                     device=args.device, gradient_checkpointing=args.gradient_checkpointing,
                     **({"shared_critic": args.shared_critic} if args.child == "ppo" else {}))
        cfg.validate()
        model, tokenizer = policy.load_policy(args.model, args.device, cfg.gradient_checkpointing)
        ref = policy.load_reference(args.model, args.device)
        algo = Algo(cfg, model, tokenizer, ref)
        optimizer = policy.make_optimizer(algo.param_groups(), cfg.lr)
        engine = make_engine("hf", model, tokenizer, compute_dtype(model))
    setup_seconds = time.perf_counter() - start
    setup = (rss_bytes() if not cuda else torch.cuda.memory_allocated()) - base

    # ----- one step, measured -----
    peak = start_peak(cuda)
    start = time.perf_counter()
    if args.child == "es":
        seeds, signs, rewards, _, tokens = es.es_iteration(cfg, 1, engine, scorer, params, layers, prompts)
        z = es.normalise(rewards)
        if z is not None:
            es.update_weights(cfg, params, layers, *es.update_coefficients(seeds, signs, z, cfg.alpha))
        responses, reward = cfg.population * len(prompts), float(rewards.mean())
    else:
        samples = sampling.sample(engine, scorer, prompts, cfg.group_size, cfg.max_new_tokens,
                                  cfg.gen_batch_size, cfg.temperature, seed=0)
        algo.update(algo.prepare(samples), optimizer)
        responses, reward = len(samples), float(samples.rewards.mean())
    top, how = peak.read()
    n_params = sum(p.numel() for p in model.parameters())
    return {"algorithm": args.child, "peak_bytes": top - base, "setup_bytes": setup, "method": how,
            "device": "cuda" if cuda else "cpu", "parameters": n_params, "responses": responses,
            "step_seconds": time.perf_counter() - start, "setup_seconds": setup_seconds, "reward": reward}


# ----- the report ---------------------------------------------------------------------------------


def batch_arguments(parser, group_size: int, cases) -> None:
    """The options of the measured batch, where and the output, shared by this command and ``lora.py``
    (``--child CASE``: the process that measures one case)."""
    parser.add_argument("--model", default="smollm2-135m", help="model (default: smollm2-135m)")
    parser.add_argument("--env", default="Conciseness-v0", help="environment whose train prompts form the batch")
    parser.add_argument("--prompts", type=int, default=2, help="prompts in the batch (default 2)")
    parser.add_argument("--group-size", type=int, default=group_size, help=f"G for GRPO/PPO and N for ES (default {group_size})")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="generation budget (default 48)")
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", choices=cases, help=argparse.SUPPRESS)


def batch_passthrough(args) -> list[str]:
    """``batch_arguments``' options as the measuring processes get them."""
    return ["--model", args.model, "--env", args.env, "--prompts", str(args.prompts), "--group-size",
            str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
            *(["--device", args.device] if args.device else [])]


def in_fresh_processes(module: str, passthrough: list[str], cases, env: dict[str, str] | None = None) -> dict[str, dict]:
    """``python -m module PASSTHROUGH --child CASE`` for each case, one fresh process each (peak
    memory does not mix), with ``env`` added to its environment: the RESULT line each prints, by
    case; exits with the stderr of one that fails."""
    results = {}
    for case in cases:
        print(f"measuring {case} in a fresh process ...", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", module, *passthrough, "--child", case], capture_output=True, text=True,
                              env={**os.environ, **(env or {})})
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.exit(f"error: the {case} measurement failed:\n{proc.stderr[-3000:]}")
        results[case] = json.loads(line[len("RESULT "):])
    return results


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    batch_arguments(parser, 8, ALGORITHMS)
    parser.add_argument("--gen-batch-size", type=int, default=32, help="sequences per generate() call")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="for the RL steps")
    parser.add_argument("--shared-critic", action="store_true", help="PPO: the value head on the policy's trunk "
                                                                     "(default: a separate critic model)")
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return

    passthrough = [*batch_passthrough(args), "--gen-batch-size", str(args.gen_batch_size),
                   *(["--gradient-checkpointing"] if args.gradient_checkpointing else []),
                   *(["--shared-critic"] if args.shared_critic else [])]
    results = in_fresh_processes("benchmarks.memory.peak", passthrough, ALGORITHMS)

    es_peak = results["es"]["peak_bytes"]
    mib = 2 ** 20
    first = results["es"]
    print(f"\nmodel {args.model} ({first['parameters'] / 1e6:.1f}M parameters), {first['device']}, "
          f"{args.prompts} prompts x {args.group_size} responses, {args.max_new_tokens} new tokens; "
          f"peak = {first['method']} during one step minus the memory in use before loading any model")
    print(f"{'algorithm':<10}{'peak MiB':>10}{'x ES':>7}{'setup MiB':>11}{'step s':>8}")
    for algo, r in results.items():
        print(f"{algo:<10}{r['peak_bytes'] / mib:>10.0f}{r['peak_bytes'] / es_peak:>7.2f}"
              f"{r['setup_bytes'] / mib:>11.0f}{r['step_seconds']:>8.1f}")
    ratios = ":".join(f"{results[a]['peak_bytes'] / es_peak:.2f}" for a in ALGORITHMS)
    print(f"ES:GRPO:PPO peak memory = {ratios}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"}, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
