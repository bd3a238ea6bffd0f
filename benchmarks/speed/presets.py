"""Each CPU preset measured (docs/es.md#sized-to-the-machine): every trainer's ``--preset cpu`` run on
each env, its estimate line (said before its first work) next to the seconds per iteration it then
logged, and whether its reward moved in the short run.

    python -m benchmarks.speed.presets                                    # ES on the five envs
    python -m benchmarks.speed.presets --trainers es,grpo,ppo --envs Sudoku-v0,Countdown-v0
    python -m benchmarks.speed.presets --iterations 2 --out runs/presets-quick   # time only: 2 units each

Each run is ``python -m trainers.TRAINER --env ENV --preset cpu`` in its own process (its output in
OUT/TRAINER-ENV.log), the preset's whole short run unless ``--iterations`` caps it (then the reward
columns say little). A finished run is not redone when the command runs again. Written: OUT/presets.md
(the table docs/es.md takes) and OUT/presets.json. The first line printed and the table's header name
this machine. MATH-v0 needs its data (``LLM_ENVS_MATH_DIR`` for its test split; its train split comes from
the hub, or from a file given with ``--env-args '{"data": {"train": "PATH"}}'``); a run that fails is reported
as such.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from trainers.common.run_dir import read_jsonl

ENVS = ("Sudoku-v0", "Countdown-v0", "MATH-v0", "ARC-AGI-v0", "Conciseness-v0")
UNIT = {"es": "iterations", "grpo": "steps", "ppo": "steps"}


def estimate_line(log: str) -> str | None:
    """The trainer's whole-run estimate (``sizing.Choice.line``) in its output."""
    return next((line for line in log.splitlines() if "completions of up to" in line and "estimated ~" in line), None)


def preset_outcome(run: Path, log_text: str, seconds: float) -> dict:
    """What a finished run says: its estimate, the seconds its iterations logged, its rewards."""
    log = read_jsonl(run / "log.jsonl")
    train = [r for r in log if "reward_mean" in r]
    evals = [r for r in log if "eval_reward" in r]
    line = estimate_line(log_text) or ""
    per_unit = re.search(r"estimated ~([^ ]+ [^ ]+) per", line)
    return {"run": str(run), "estimate": line, "estimated_per_unit": per_unit.group(1) if per_unit else None,
            "units": len(train), "seconds_per_unit": sum(r["seconds"] for r in train) / len(train) if train else None,
            "train_reward": [r["reward_mean"] for r in train], "eval_reward": [r["eval_reward"] for r in evals],
            "eval_pass@1": [r["eval_pass@1"] for r in evals], "wall_seconds": seconds}


def moved(values: list[float]) -> str:
    if len(values) < 2:
        return "–"
    return f"{values[0]:.3f} -> {values[-1]:.3f}"


def presets_table(results: list[dict], machine: str) -> str:
    lines = [f"Measured on {machine}.", "",
             "| trainer | env | estimate said (per unit) | measured s per unit | units | training reward | "
             "held-out reward |", "|---|---|---:|---:|---:|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['trainer']} | {r['env']} | – | failed: {r['error']} | | | |")
            continue
        measured = f"{r['seconds_per_unit']:.1f}" if r["seconds_per_unit"] is not None else "–"
        lines.append(f"| {r['trainer']} | {r['env']} | {r['estimated_per_unit'] or '–'} | {measured} | {r['units']} | "
                     f"{moved(r['train_reward'])} | {moved(r['eval_reward'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    from trainers.common.config import Parser
    from trainers.common.hardware import machine_line

    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated env ids")
    parser.add_argument("--trainers", default="es", help="comma-separated: es, grpo, ppo")
    parser.add_argument("--iterations", type=int, help="cap every run at this many iterations (steps)")
    parser.add_argument("--model", help="another model than the default (a smoke run on a tiny one)")
    parser.add_argument("--env-args", help="JSON options for every env (e.g. MATH-v0's data files), passed as "
                                           "the trainers' --env-args")
    parser.add_argument("--out", default="runs/presets", help="where the runs and the table go")
    args = parser.parse_args(argv)
    trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    if unknown := [t for t in trainers if t not in UNIT]:
        parser.error(f"--trainers: {', '.join(unknown)}: not one of {', '.join(UNIT)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_line()
    print(machine, flush=True)
    results = []
    for trainer in trainers:
        for env in [e.strip() for e in args.envs.split(",") if e.strip()]:
            name = f"{trainer}-{env.replace('/', '_').replace(':', '_')}"
            run, log_file = out / name, out / f"{name}.log"
            cmd = [sys.executable, "-m", f"trainers.{trainer}", "--env", env, "--preset", "cpu", "--out", str(run),
                   *(["--model", args.model] if args.model else []),
                   *(["--env-args", args.env_args] if args.env_args else []),
                   *([f"--{UNIT[trainer]}", str(args.iterations)] if args.iterations else [])]
            start = time.perf_counter()
            if not (run / "final").is_dir():
                if run.exists():
                    cmd = [sys.executable, "-m", f"trainers.{trainer}", "--resume", str(run)]
                print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
                with open(log_file, "a") as log:
                    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
                if done.returncode != 0:
                    tail = log_file.read_text().strip().splitlines()[-1:] or ["?"]
                    results.append({"trainer": trainer, "env": env, "error": tail[0][:200]})
                    print(f"[{name}] failed: {tail[0][:200]}", flush=True)
                    continue
            result = {"trainer": trainer, "env": env,
                      **preset_outcome(run, log_file.read_text(), time.perf_counter() - start)}
            results.append(result)
            print(f"[{name}] said: {result['estimate']}\n[{name}] measured: {result['seconds_per_unit']} s per "
                  f"{UNIT[trainer][:-1]}, training reward {moved(result['train_reward'])}", flush=True)
    (out / "presets.json").write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")
    (out / "presets.md").write_text(presets_table(results, machine))
    print("\n" + presets_table(results, machine), end="")
    return results


if __name__ == "__main__":
    main()
