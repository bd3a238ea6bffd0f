"""One RL step, ours against TRL's ``GRPOTrainer``, side by side in one run on the same task, model,
prompts, batch shape, micro-batching and dtype:

    python -m benchmarks.speed.rl                    # the default: every configuration below, ABBA
    python -m benchmarks.speed.rl --only ours        # without TRL (no trl extra needed)
    python -m benchmarks.speed.rl --steps 3 --dtypes fp32 bf16

The step: rg/basic_arithmetic-v0 (two one-digit terms, + and -, the 4-seed study's task), the
default model, 8 prompts x G=8 responses of at most 64 tokens, lr 1e-5, beta 0, sampling at
temperature 1. Micro-batches of 8 responses (one group) on both sides: ours ``--grad-accum 8``,
TRL ``per_device_train_batch_size=8, gradient_accumulation_steps=8``. Configurations:

- ours with the default dtype (``--dtype auto``: what the CPU probe measured faster here, printed
  in the header with its numbers, ``trainers/common/precision.py``), shared prefix on (the default);
- ours, ``--shared-prefix off`` and ``on``, in each explicit dtype (``--dtypes``, default fp32 and
  bf16), so the default's step stands beside both;
  generation on ``--engine`` (default auto, what a user gets: ``trainers.engines.choice``, native on
  CPU for the default model);
- ours in one backward pass (no ``--grad-accum``, shared prefix on, default dtype): the memory of
  64 responses at once;
- TRL (``pip install -e '.[trl]'``), fed through ``trainers.trl`` with our steps' prompts in our
  order, at its defaults (gradient checkpointing on) and without gradient checkpointing, in each
  explicit dtype (TRL's bf16: autocast over fp32 weights, as ours).

Each configuration runs in its own process (peak memory does not mix) for ``--steps`` steps; the
first warms up and is not reported. The configurations run in ABBA order (the list, then the list
reversed), so each is measured twice and a drift of the machine hits all alike. Printed per
configuration: the sampling, update and step seconds (mean of its measured steps), the mean
completion length and the peak resident memory; then the ratios the issue asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "rg/basic_arithmetic-v0"
ENV_ARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
            "allow_parentheses": False, "allow_negation": False}
PROMPTS, GROUP, TOKENS, LR = 8, 8, 64, 1e-5


def configurations(dtypes: list[str], only: str | None) -> list[dict]:
    out = []
    if only in (None, "ours"):
        out += [{"who": "ours", "dtype": "auto", "shared": "on", "grad_accum": GROUP}]  # the default step
        out += [{"who": "ours", "dtype": d, "shared": s, "grad_accum": GROUP} for d in dtypes for s in ("off", "on")]
        out += [{"who": "ours", "dtype": "auto", "shared": "on", "grad_accum": 1}]
    if only in (None, "trl"):
        out += [{"who": "trl", "dtype": d, "checkpointing": c} for d in dtypes for c in (True, False)]
    return out


def label(c: dict) -> str:
    if c["who"] == "ours":
        one = ", one backward pass" if c["grad_accum"] == 1 else ""
        dtype = "default dtype (auto)" if c["dtype"] == "auto" else c["dtype"]
        return f"ours, shared prefix {c['shared']}, {dtype}{one}"
    return f"TRL, {'defaults (gradient checkpointing on)' if c['checkpointing'] else 'no gradient checkpointing'}, {c['dtype']}"


# ----- children: one configuration each ----------------------------------------------------------------


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def run_ours(c: dict, steps: int, engine: str, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """Our GRPO in this process; ``extra``: flags that override the defaults (benchmarks.gpu.speed)."""
    from trainers.rl import grpo

    argv = ["--env", ENV, "--env-args", json.dumps(ENV_ARGS), "--steps", str(steps), "--batch-size", str(PROMPTS),
            "--group-size", str(GROUP), "--max-new-tokens", str(TOKENS), "--lr", str(LR), "--beta", "0",
            "--eval-every", "0", "--eval-limit", "1", "--checkpoint-every", "1000", "--engine", engine,
            "--dtype", c["dtype"], "--shared-prefix", c["shared"], "--grad-accum", str(c["grad_accum"]),
            "--out", str(out / "run"), *extra]
    run = grpo.train(grpo.resolve(argv))
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps_log = [r for r in log if "reward_mean" in r]
    runtime = json.loads((run / "runtime.jsonl").read_text().splitlines()[0])
    return {"steps": [{"sampling": r["sampling_seconds"], "update": r["seconds"] - r["sampling_seconds"],
                       "step": r["seconds"], "length": r["response_length"]} for r in steps_log],
            "dtype": runtime["dtype"], "precision": runtime.get("precision"), "machine": runtime["machine"]}


def run_trl(c: dict, steps: int, out: Path) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import llm_envs
    from trainers.trl import EnvReward, prompt_text
    from trainers.common.models import DEFAULT_MODEL, load_model
    from trainers.common.rollout import batch_for

    env = llm_envs.make(ENV, **ENV_ARGS)
    train = env.examples("train")
    model, tokenizer = load_model(DEFAULT_MODEL, device="cpu", dtype=torch.float32, verbose=False)
    position = {e.id: i for i, e in enumerate(train)}
    chosen = [(position[e.id], e) for s in range(1, steps + 1) for e in batch_for(train, PROMPTS, 0, s)]  # ours
    rows = Dataset.from_dict({"prompt": [prompt_text(tokenizer, e) for _, e in chosen], "split": ["train"] * len(chosen),
                              "index": [i for i, _ in chosen]})
    config = GRPOConfig(output_dir=str(out / "trl"), use_cpu=True, bf16=c["dtype"] == "bf16",
                        gradient_checkpointing=c["checkpointing"], num_generations=GROUP,
                        per_device_train_batch_size=GROUP, gradient_accumulation_steps=PROMPTS,
                        max_completion_length=TOKENS, learning_rate=LR, beta=0.0, temperature=1.0, max_steps=steps,
                        logging_steps=1, report_to=[], shuffle_dataset=False, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[EnvReward(env, workers=0)],
                          train_dataset=rows, args=config)
    sampling: list[float] = []
    generate = trainer._generate_and_score_completions

    def timed_generate(*args, **kwargs):  # TRL samples (and scores) inside the step: time it apart
        start = time.perf_counter()
        result = generate(*args, **kwargs)
        sampling.append(time.perf_counter() - start)
        return result

    trainer._generate_and_score_completions = timed_generate
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            times.append(time.perf_counter() - self.start)

    trainer.add_callback(Clock())
    trainer.train()
    env.close()
    lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    return {"steps": [{"sampling": s, "update": t - s, "step": t, "length": n}
                      for s, t, n in zip(sampling, times, lengths)], "dtype": c["dtype"], "trl": trl.__version__,
            "gradient_checkpointing": c["checkpointing"]}


def child(c: dict, steps: int, engine: str) -> None:
    from trainers.common.hardware import describe

    with tempfile.TemporaryDirectory() as tmp:
        result = run_ours(c, steps, engine, Path(tmp)) if c["who"] == "ours" else run_trl(c, steps, Path(tmp))
    print("RESULT " + json.dumps(result | {"peak_gb": peak_rss_gb(), "machine": describe("cpu")}), flush=True)


# ----- the parent ----------------------------------------------------------------------------------------


def measure(c: dict, steps: int, engine: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.speed.rl", "--child", json.dumps(c), "--steps", str(steps),
           "--engine", engine]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LLM_ENVS_PROGRESS": "lines"})
    if done.returncode != 0 or "RESULT " not in done.stdout:
        return {"error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def summary(results: list[dict]) -> dict:
    """Means over the measured steps (each run's first step warms up) of every run of a configuration."""
    steps = [s for r in results if "steps" in r for s in r["steps"][1:]]
    if not steps:
        return {"error": next((r["error"] for r in results if "error" in r), "no measured step")}
    mean = lambda key: statistics.fmean(s[key] for s in steps)  # noqa: E731
    return {"sampling": mean("sampling"), "update": mean("update"), "step": mean("step"), "length": mean("length"),
            "peak_gb": max(r["peak_gb"] for r in results if "peak_gb" in r), "n": len(steps),
            "steps": [round(s["step"], 1) for s in steps]}


def main(argv: list[str] | None = None) -> dict:
    from trainers.common.config import Parser

    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=2, help="steps per run (the first warms up)")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                        help="explicit dtypes timed beside the default (--dtype auto), which always runs")
    parser.add_argument("--only", choices=["ours", "trl"], default=None)
    parser.add_argument("--engine", default="auto", choices=["auto", "hf", "native", "vllm"],
                        help="our generation engine (auto: the trainers' default)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps: at least 2 (the first warms up)")
    if args.child:
        child(json.loads(args.child), args.steps, args.engine)
        return {}
    from trainers.common.precision import decide, header_line

    dtypes = list(dict.fromkeys(args.dtypes))
    configs = configurations(dtypes, args.only)
    default = decide("cpu")  # what the default step's run decides: the probe, cached, on these threads
    print(f"RL step on {header_line('cpu', decision=default)}: {ENV} (2 one-digit terms), default model, {PROMPTS} prompts x "
          f"G={GROUP}, {TOKENS} new tokens, lr {LR:g}, beta 0; micro-batches of {GROUP} responses; our engine "
          f"{args.engine}; {args.steps} steps per run, the first not reported; ABBA over {len(configs)} "
          f"configurations", flush=True)
    runs: dict[int, list[dict]] = {i: [] for i in range(len(configs))}
    for i in list(range(len(configs))) + list(reversed(range(len(configs)))):  # ABBA
        start = time.perf_counter()
        runs[i].append(measure(configs[i], args.steps, args.engine))
        print(f"  ran {label(configs[i])} ({time.perf_counter() - start:.0f} s)", flush=True)
    rows = [{"config": c, "label": label(c), **summary(runs[i])} for i, c in enumerate(configs)]
    print("\n| configuration | sampling s | update s | step s | mean completion tokens | peak resident |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['label']} | failed: {r['error'].strip().splitlines()[-1][:120]} | | | | |")
            continue
        print(f"| {r['label']} | {r['sampling']:.1f} | {r['update']:.1f} | {r['step']:.1f} | {r['length']:.1f} | "
              f"{r['peak_gb']:.1f} GB |")
    print("\n" + ratios(rows, dtypes), flush=True)
    result = {"machine": header_line("cpu", decision=default), "precision": default.record(), "rows": rows, "dtypes": dtypes}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def ratios(rows: list[dict], dtypes: list[str]) -> str:
    """The update with the shared prefix against without; our step against TRL's, per dtype."""
    find = {r["label"]: r for r in rows if "error" not in r}
    lines = []
    default = find.get("ours, shared prefix on, default dtype (auto)")
    for d in dtypes:
        explicit = find.get(f"ours, shared prefix on, {d}")
        if default and explicit:
            lines.append(f"default dtype (auto) step / {d} step = {default['step'] / explicit['step']:.2f}x "
                         f"({default['step']:.1f} s vs {explicit['step']:.1f} s)")
    for d in dtypes:
        off, on = find.get(f"ours, shared prefix off, {d}"), find.get(f"ours, shared prefix on, {d}")
        if off and on:
            lines.append(f"{d}: update without / with the shared prefix = {off['update'] / on['update']:.2f}x "
                         f"(step {off['step'] / on['step']:.2f}x)")
        for name in ("defaults (gradient checkpointing on)", "no gradient checkpointing"):
            peer = find.get(f"TRL, {name}, {d}")
            if peer and on:
                lines.append(f"{d}: TRL ({name}) step / ours (shared prefix on) = {peer['step'] / on['step']:.2f}x; "
                             f"update {peer['update'] / on['update']:.2f}x")
    one = next((r for r in rows if r["label"].endswith("one backward pass") and "error" not in r), None)
    if one:
        lines.append(f"one backward pass of {PROMPTS * GROUP} responses ({one['config']['dtype']}, shared prefix): "
                     f"peak resident {one['peak_gb']:.1f} GB (target <= 10 GB), step {one['step']:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
