"""The paper's RL hyperparameter sweep in one command: run the grid KL coefficient beta x learning
rate (default {1e-3, 5e-3} x {1e-6, 1e-5}, as in the paper's Table 5) and keep the best run.

    python -m trainers.sweep grpo --env Countdown-v0
    python -m trainers.sweep grpo --env Countdown-v0 --loss dr_grpo --betas 0
    python -m trainers.sweep ppo --env Countdown-v0 --steps 200 --out runs/sweep-ppo
    python -m trainers.sweep grpo --env Conciseness-v0 --metric eval_reward --betas 0,0.01 --lrs 5e-6

Every flag that is not the sweep's own goes to the trainer (``python -m trainers.grpo --help``).
Runs are written to OUT/beta=B_lr=L/. Repeating the command skips finished runs and resumes
unfinished ones. The best run is the one with the highest final held-out --metric (ties: the other
held-out metric, then the mean training reward of its last fifth); it is recorded in
OUT/sweep.json and linked as OUT/best. The other runs keep their logs but their weights are
deleted, unless --keep-all.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import llm_envs
from trainers.config import ConfigError, fail
from trainers.run_dir import RunDirError, read_jsonl

ALGORITHMS = ("grpo", "ppo")
METRICS = ("eval_pass@1", "eval_reward")
OWN = ("--beta", "--lr", "--out", "--resume")  # set by the sweep per run


def floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Other flags go to the trainer.",
                                     allow_abbrev=False)  # --lr must not read as --lrs
    parser.add_argument("algorithm", choices=ALGORITHMS)
    parser.add_argument("--betas", type=floats, default=[1e-3, 5e-3], help="KL coefficients (default: 1e-3,5e-3)")
    parser.add_argument("--lrs", type=floats, default=[1e-6, 1e-5], help="learning rates (default: 1e-6,1e-5)")
    parser.add_argument("--metric", choices=METRICS, default="eval_pass@1", help="what 'best' maximises (default: eval_pass@1)")
    parser.add_argument("--out", help="sweep directory (default runs/sweep-ALGO-ENV-TIME)")
    parser.add_argument("--keep-all", action="store_true", help="keep every run's weights, not only the best's")
    args, rest = parser.parse_known_args(argv)
    for flag in rest:
        if flag.split("=")[0] in OWN:
            parser.error(f"{flag.split('=')[0]} is set by the sweep (use --betas, --lrs, --out)")
    return args, rest


def run_name(beta: float, lr: float) -> str:
    return f"beta={beta:g}_lr={lr:g}"


def outcome(path: Path, metric: str) -> dict:
    """The final held-out metrics and the late training reward of one finished run."""
    log = read_jsonl(path / "log.jsonl")
    evals = [r for r in log if "eval_reward" in r]
    train = [r["reward_mean"] for r in log if "reward_mean" in r]
    late = float(np.mean(train[-max(1, len(train) // 5):])) if train else float("-inf")
    last = evals[-1] if evals else {}
    other = [m for m in METRICS if m != metric][0]
    return {"run": path.name, metric: last.get(metric, float("-inf")), other: last.get(other, float("-inf")),
            "train_reward_late": late, "samples": max([r.get("samples", 0) for r in log] or [0])}


def sweep(argv: list[str] | None = None) -> Path:
    args, rest = parse(argv)
    trainer = __import__(f"trainers.{args.algorithm}", fromlist=["resolve", "train"])
    # Validate the trainer's flags once, before any run starts.
    base = trainer.resolve(rest + ["--out", "unused", "--beta", str(args.betas[0]), "--lr", str(args.lrs[0])])
    out = Path(args.out or f"runs/sweep-{args.algorithm}-{base.env}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    grid = [(beta, lr) for beta in args.betas for lr in args.lrs]
    for k, (beta, lr) in enumerate(grid, 1):
        path = out / run_name(beta, lr)
        print(f"[sweep {k}/{len(grid)}] {args.algorithm} beta={beta:g} lr={lr:g} -> {path}", file=sys.stderr)
        if (path / "result.json").is_file():
            print(f"[sweep] {path} finished earlier: skipped", file=sys.stderr)
            continue
        if not (path / "final").is_dir():
            if (path / "config.yaml").is_file():  # an interrupted run: continue it
                cfg = trainer.resolve(["--resume", str(path)])
            else:
                cfg = trainer.resolve(rest + ["--out", str(path), "--beta", repr(beta), "--lr", repr(lr)])
            trainer.train(cfg)
        (path / "result.json").write_text(json.dumps(outcome(path, args.metric)) + "\n")

    other = [m for m in METRICS if m != args.metric][0]
    results = [json.loads((out / run_name(b, lr) / "result.json").read_text()) for b, lr in grid]
    best = max(results, key=lambda r: (r[args.metric], r[other], r["train_reward_late"]))
    summary = {"algorithm": args.algorithm, "metric": args.metric, "grid": {"beta": args.betas, "lr": args.lrs},
               "best": best["run"], "results": results}
    (out / "sweep.json").write_text(json.dumps(summary, indent=1) + "\n")
    link = out / "best"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(best["run"], target_is_directory=True)
    if not args.keep_all:
        for r in results:
            if r["run"] != best["run"]:
                shutil.rmtree(out / r["run"] / "final", ignore_errors=True)
                shutil.rmtree(out / r["run"] / "checkpoints", ignore_errors=True)
    width = max(len(r["run"]) for r in results)
    for r in results:
        mark = "  <- best" if r["run"] == best["run"] else ""
        print(f"{r['run']:<{width}}  {args.metric} {r[args.metric]:.4f}  {other} {r[other]:.4f}  "
              f"train reward (late) {r['train_reward_late']:.4f}{mark}", file=sys.stderr)
    print(f"best: {out / best['run']} (linked as {link})", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    try:
        sweep(argv)
    except (ConfigError, RunDirError, llm_envs.DataError) as exc:
        fail(str(exc))


if __name__ == "__main__":
    main()
