"""The paper's RL hyperparameter sweep in one command: run the grid KL coefficient beta x learning
rate (default {1e-3, 5e-3} x {1e-6, 1e-5}, as in the paper's Table 5), select the best run on a
validation split, and report the selected run on the test split.

    python -m trainers.sweep grpo --env Countdown-v0
    python -m trainers.sweep grpo --env Countdown-v0 --loss dr_grpo --betas 0
    python -m trainers.sweep ppo --env Countdown-v0 --steps 200 --out runs/sweep-ppo
    python -m trainers.sweep grpo --env Sudoku-v0 --metric eval_reward --val-size 100 --lrs 5e-6

Selection never sees the test split. By default every run trains on the training split minus a
validation split carved from it (``--val-size``: a fraction of train, default 0.1, or a number of
examples; a fixed choice, the same for every run: ``trainers.common.splits``), and its held-out
evaluations are on that validation split. The best run is the one with the highest final
validation --metric (ties: the other metric, then the mean training reward of its last fifth);
only then is its final model measured on the reported split (the trainer's --eval-split, default
test), once. A carved validation split must hold at least MIN_VALIDATION examples and leave as
many for training: a smaller train split (Conciseness-v0 has 2 prompts) is refused, and
``--val-split NAME`` selects on a split the environment already has instead (for instance one
given as a data file: ``--env-args '{"data": {"validation": "val.jsonl"}}' --val-split
validation``), never on the reported one.

Every flag that is not the sweep's own goes to the trainer (``python -m trainers.grpo --help``):
``--report-to wandb`` tracks every run, in one group named as the sweep's directory (``--report-group``
names another).
Runs are written to OUT/beta=B_lr=L/ (their config.yaml records val_size and eval_split). They
start from the same model, so the first run's validation before training is the others' too
(OUT/base_held_out.json, ``--base-eval``).
Repeating the command skips finished runs and resumes unfinished ones. The selection and the
selected run's test numbers are in OUT/sweep.json; the selected run is linked as OUT/best. The
other runs keep their logs but their weights are deleted, unless --keep-all.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import yaml

import llm_envs
from trainers.common import base_eval
from trainers.common.config import USER_ERRORS, ConfigError, Parser, fail, make_env
from trainers.common.models import load_model
from trainers.common.rollout import evaluate
from trainers.common.run_dir import read_jsonl
from trainers.common.splits import MIN_VALIDATION, VALIDATION
from trainers.engines import make_engine

ALGORITHMS = ("grpo", "ppo")
METRICS = ("eval_pass@1", "eval_reward")
OWN = ("--beta", "--lr", "--out", "--resume", "--val-size")  # set by the sweep per run


def size(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (0 < value < 1 or (value >= 1 and value.is_integer())):
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1) or a number of examples, got {text!r}")
    return value


def floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def parse(argv: list[str] | None):
    parser = Parser(description=__doc__.split("\n\n")[0], epilog="Other flags go to the trainer.",
                    allow_abbrev=False)  # --lr must not read as --lrs
    parser.add_argument("algorithm", choices=ALGORITHMS)
    parser.add_argument("--betas", type=floats, default=[1e-3, 5e-3], help="KL coefficients (default: 1e-3,5e-3)")
    parser.add_argument("--lrs", type=floats, default=[1e-6, 1e-5], help="learning rates (default: 1e-6,1e-5)")
    parser.add_argument("--metric", choices=METRICS, default="eval_pass@1",
                        help="what 'best' maximises on the validation split (default: eval_pass@1)")
    parser.add_argument("--val-size", type=size, default=0.1,
                        help="validation split carved from train: a fraction of it or a number of examples (default 0.1)")
    parser.add_argument("--val-split", help="select on this existing split of the env instead of carving one")
    parser.add_argument("--out", help="sweep directory (default runs/sweep-ALGO-ENV-TIME)")
    parser.add_argument("--keep-all", action="store_true", help="keep every run's weights, not only the best's")
    args, rest = parser.parse_known_args(argv)
    for flag in rest:
        if flag.split("=")[0] in OWN:
            parser.error(f"{flag.split('=')[0]} is set by the sweep (use --betas, --lrs, --out, the sweep's --val-size)")
    return args, rest


def run_name(beta: float, lr: float) -> str:
    return f"beta={beta:g}_lr={lr:g}"


def validation_flags(args, env, report_split: str) -> list[str]:
    """The trainer flags that make every run evaluate on the validation split: a carved one
    (``--val-size K --eval-split validation``) or ``--val-split``'s; refuses what cannot work."""
    if args.val_split:
        if args.val_split == report_split:
            raise ConfigError(f"--val-split {args.val_split}: that is the split the sweep reports (--eval-split); "
                              f"select on another one")
        try:
            env.examples(args.val_split)
        except KeyError as exc:
            raise ConfigError(f"--val-split: {exc.args[0]}") from None
        return ["--eval-split", args.val_split]
    n = len(env.examples("train"))
    k = round(args.val_size * n) if args.val_size < 1 else int(args.val_size)
    if k < MIN_VALIDATION or n - k < MIN_VALIDATION:
        raise ConfigError(f"--val-size {args.val_size:g}: {k} of the {n} training examples would be held out; a "
                          f"validation split carved from train needs at least {MIN_VALIDATION} examples and must "
                          f"leave as many to train on. Select on a split the env has with --val-split NAME (e.g. "
                          f"--env-args '{{\"data\": {{\"{VALIDATION}\": \"val.jsonl\"}}}}' --val-split {VALIDATION})")
    return ["--val-size", str(k), "--eval-split", VALIDATION]


def outcome(path: Path, metric: str) -> dict:
    """The final held-out (validation) metrics and the late training reward of one finished run."""
    log = read_jsonl(path / "log.jsonl")
    evals = [r for r in log if "eval_reward" in r]
    train = [r["reward_mean"] for r in log if "reward_mean" in r]
    late = float(np.mean(train[-max(1, len(train) // 5):])) if train else float("-inf")
    last = evals[-1] if evals else {}
    other = [m for m in METRICS if m != metric][0]
    return {"run": path.name, "split": read_config(path).get("eval_split"), metric: last.get(metric, float("-inf")),
            other: last.get(other, float("-inf")), "train_reward_late": late,
            "samples": max([r.get("samples", 0) for r in log] or [0])}


def read_config(path: Path) -> dict:
    return yaml.safe_load((path / "config.yaml").read_text()) or {}


def measure_selected(run: Path, env, cfg, split: str) -> dict:
    """The selected run's final model measured on the reported ``split`` (once: kept in test.json)."""
    done = run / "test.json"
    if done.is_file():
        saved = json.loads(done.read_text())
        if saved.get("split") == split:
            return saved
    model, tokenizer = load_model(str(run / "final"), device=cfg.device)
    with llm_envs.BatchScorer(env, cfg.score_workers) as scorer, make_engine(cfg, model, tokenizer) as engine:
        scores = evaluate(engine, scorer, split, cfg.max_new_tokens or env.max_new_tokens,
                          cfg.gen_batch_size, cfg.eval_limit)
    result = {"run": run.name, "split": split, "eval_pass@1": scores["pass@1"], "eval_reward": scores["reward"],
              "n": scores["n"]}
    done.write_text(json.dumps(result) + "\n")
    return result


def sweep(argv: list[str] | None = None) -> Path:
    args, rest = parse(argv)
    trainer = importlib.import_module(f"trainers.rl.{args.algorithm}")  # its resolve and train
    # Validate the trainer's flags once, before any run starts.
    base = trainer.resolve(rest + ["--out", "unused", "--beta", str(args.betas[0]), "--lr", str(args.lrs[0])])
    report = base.eval_split  # what the sweep reports for the selected run, never selects on
    env = make_env(base.env, base.env_args, splits=("train",))  # bad options end here, before OUT exists
    try:
        env.examples(report)
    except KeyError as exc:
        raise ConfigError(f"--eval-split (the split the sweep reports): {exc.args[0]}") from None
    rest = rest + validation_flags(args, env, report)  # later flags win: the runs evaluate on validation
    trainer.resolve(rest + ["--out", "unused", "--beta", str(args.betas[0]), "--lr", str(args.lrs[0])])
    out = Path(args.out or f"runs/sweep-{args.algorithm}-{base.env}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    if not any(flag.split("=")[0] == "--report-group" for flag in rest):  # --report-to's runs: one group per sweep
        rest = rest + ["--report-group", out.name]
    if not any(flag.split("=")[0] == "--base-eval" for flag in rest):  # the base model's validation, made once
        rest = rest + ["--base-eval", str(out / base_eval.FILE)]
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
    # Selection: validation numbers only.
    best = max(results, key=lambda r: (r[args.metric], r[other], r["train_reward_late"]))
    test = measure_selected(out / best["run"], env, base, report)
    env.close()
    summary = {"algorithm": args.algorithm, "metric": args.metric, "grid": {"beta": args.betas, "lr": args.lrs},
               "selected_on": results[0].get("split"), "best": best["run"], "results": results, "test": test}
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
    print(f"on the {summary['selected_on']} split:", file=sys.stderr)
    for r in results:
        mark = "  <- best" if r["run"] == best["run"] else ""
        print(f"{r['run']:<{width}}  {args.metric} {r[args.metric]:.4f}  {other} {r[other]:.4f}  "
              f"train reward (late) {r['train_reward_late']:.4f}{mark}", file=sys.stderr)
    print(f"best: {out / best['run']} (linked as {link}); on the {report} split (n={test['n']}): "
          f"eval_pass@1 {test['eval_pass@1']:.4f}  eval_reward {test['eval_reward']:.4f}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    try:
        sweep(argv)
    except USER_ERRORS as exc:
        fail(str(exc))


if __name__ == "__main__":
    main()
