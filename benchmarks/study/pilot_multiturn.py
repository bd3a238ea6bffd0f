"""The second multi-turn pilot (issue 56): with stop strings, GuessNumber-v0 and Countdown-calc-v0
(a calculator tool), before and after low-rank ES and Dr.GRPO, one seed each, the default model.

It is the first pilot's machinery (docs/study.md, "Multi-turn pilot"): the trainers and ``python -m
eval`` as they are, one command each, then ``python -m eval.table --table episodes``. Every command
is printed before it runs and written to OUT/commands.sh; a step whose output exists is skipped,
so a killed pilot continues where it stopped when run again.

    python -m benchmarks.study.pilot_multiturn --out runs/pilot56            # the pilot: about 80 min on 2 CPU cores
    python -m benchmarks.study.pilot_multiturn --out runs/pilot56 --dry-run  # the commands only
    python -m benchmarks.study.pilot_multiturn --out /tmp/smoke --smoke --model TINY_MODEL_DIR   # seconds

Per env: the base model's greedy episodes on the first 100 test prompts (``base``), low-rank ES
(N=16 mirrored, rank 1, sigma 1e-3, alpha 3e-3: the first pilot's) and Dr.GRPO (G=8, lr 1.2e-5,
beta 0, ``--grad-accum 8``: the first pilot's) for 512 training episodes each, and each trained
model's greedy episodes on the same 100 prompts. For Countdown-calc-v0 the base model is also
measured as the first pilot measured it (temperature 1, 4 samples on 16 prompts, 128 new tokens:
``base-sampled``), so its return and tool calls stand beside the first pilot's 0.002 and 0.02
without stop strings. OUT/table.md holds the tables: turns, tool calls, tool errors, return and
pass@1 before and after each method.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from trainers.common.cli import Parser

#: The envs: (short name, env id, --env-args, --max-new-tokens per turn). GuessNumber-v0 in 1..20
#: with 5 guesses, its turns opened with "<guess>" (the default model answers in prose otherwise);
#: Countdown-calc-v0 in the first pilot's easiest config (two numbers up to 20, targets 1-40).
ENVS = [
    ("guess", "GuessNumber-v0", {"high": 20, "max_turns": 5, "opening": "<guess>"}, 24),
    ("calc", "Countdown-calc-v0", {"min_numbers": 2, "max_numbers": 2, "max_number": 20, "min_target": 1,
                                   "max_target": 40, "test_size": 200}, 96),
]
#: The first pilot's base measurement of Countdown-calc-v0 (no stop strings then): the table shows it
#: beside this pilot's (its row labelled by the settings it differs in, stop strings among them).
FIRST_PILOT = Path(__file__).resolve().parents[2] / "docs" / "pilot-multiturn" / "base-countdown-calc"
#: The first pilot's training settings (docs/pilot-multiturn/*/run_config.yaml), one seed.
COMMON = ["--max-samples", "512", "--eval-every", "0", "--eval-limit", "10", "--seed", "0"]
METHODS = {
    "es": ["-m", "trainers.es", "--noise", "lowrank", "--rank", "1", "--population", "16", "--mirrored", "true",
           "--sigma", "1e-3", "--alpha", "3e-3", "--batch-size", "8"],
    "drgrpo": ["-m", "trainers.grpo", "--loss", "dr_grpo", "--beta", "0", "--lr", "1.2e-5", "--batch-size", "8",
               "--group-size", "8", "--grad-accum", "8"],
}
#: Held-out prompts of every evaluation (the first pilot's 100).
LIMIT = 100


def commands(out: Path, model: str, smoke: bool) -> list[tuple[Path, list[str]]]:
    """(the file that shows the step is done, its command) of every step, in order."""
    steps = []
    limit, samples = (2, "16") if smoke else (LIMIT, None)
    for name, env, args, tokens in ENVS:
        env_args = json.dumps(args)
        measure = ["--limit", str(limit), "--max-new-tokens", str(tokens)]
        base = out / f"base-{name}"
        steps.append((base, ["-m", "eval", "--model", model, "--env", env, "--env-args", env_args, *measure,
                             "--out", str(base)]))
        if name == "calc":  # the first pilot's protocol, for its numbers without stop strings
            sampled = out / f"base-sampled-{name}"
            steps.append((sampled, ["-m", "eval", "--model", model, "--env", env, "--env-args", env_args, "--samples",
                                    "4", "--temperature", "1", "--limit", str(2 if smoke else 16), "--max-new-tokens",
                                    "128", "--out", str(sampled)]))
        for method, flags in METHODS.items():
            run = out / f"{method}-{name}"
            train = [*flags, "--env", env, "--env-args", env_args, "--model", model, "--max-new-tokens", str(tokens),
                     *COMMON, "--out", str(run)]
            if smoke:  # one small update: the commands work, nothing is measured
                train = [*train, "--max-samples", samples, "--eval-limit", "2", "--dtype", "fp32"]
                train = _shrink(train, method)
            steps.append((run / "final", train))
            steps.append((run / "eval", ["-m", "eval", "--model", str(run), *measure]))
    return steps


def _shrink(train: list[str], method: str) -> list[str]:
    """A smoke run's flags: 16 episodes in one update (later flags override earlier ones)."""
    small = {"es": ["--population", "2", "--batch-size", "8"],
             "drgrpo": ["--batch-size", "2", "--group-size", "8", "--grad-accum", "1"]}[method]
    return [*train, *small]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.study.pilot_multiturn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/pilot56", help="where the runs, evaluations and table.md go")
    parser.add_argument("--model", default="smollm2-135m", help="the base model")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--smoke", action="store_true", help="a few seconds on a tiny model: 2 prompts, one update")
    args = parser.parse_args(argv)
    out = Path(args.out)
    steps = commands(out, args.model, args.smoke)
    beside = [str(FIRST_PILOT)] if FIRST_PILOT.is_dir() and not args.smoke else []
    table = [sys.executable, "-m", "eval.table", "--table", "episodes", str(out), *beside, "--out",
             str(out / "table.md")]
    lines = [shlex.join(["python", *cmd]) for _, cmd in steps] + [shlex.join(["python", *table[1:]])]
    if args.dry_run:
        print("\n".join(lines))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "commands.sh").write_text("\n".join(lines) + "\n")
    for done, cmd in steps:
        if done.exists():
            print(f"done already: {done}", flush=True)
            continue
        print("+ " + shlex.join(["python", *cmd]), flush=True)
        subprocess.run([sys.executable, *cmd], check=True)
    subprocess.run(table, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
