"""ES on several processes against one, on the same cores: P processes of T/P threads each
(``torchrun``, members split over the processes) against 1 process of T threads, side by side in
one run.

    python -m benchmarks.speed.es_scale                                   # smollm2-135m, low-rank, 2x1 against 1x2
    python -m benchmarks.speed.es_scale --engine vllm --population 16 --prompts 4 --max-new-tokens 32
    python -m benchmarks.speed.es_scale --model DIR --population 8 --prompts 2 --max-new-tokens 8 --repeats 1

Each layout is a real training run (``python -m trainers.es``, or ``torchrun --standalone
--nproc-per-node P -m trainers.es``) of ``--iterations`` iterations, with OMP_NUM_THREADS = T or
T/P; the layouts alternate, ``--repeats`` times, so a machine whose load drifts slows both alike.
Measured: the seconds of an iteration as the run logs them (``log.jsonl``: the members' generation,
the all-reduce and the update, not the start-up nor the held-out evaluations), the median over the
iterations after the first (the first alone with ``--iterations 1``; the first pays one-off
warm-up costs), and the whole launch's wall time. Printed per repeat: both layouts and the ratio
PxT/P over 1xT; at the end the median ratio against the target (``--target``, 1.3: P processes may
cost up to 30% more than one process on the same cores; they pay for separate copies of the
model, separate kernels' warm-up and the all-reduce) and whether the two layouts logged the same
updates (bit for bit only at equal threads per process: CPU matrix products round differently with
another thread count).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainers.common.config import Parser
from trainers.common.models import DEFAULT_MODEL
from trainers.engines import AUTO, ENGINES

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str] | None):
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--engine", default=AUTO, choices=[AUTO, *ENGINES],
                        help="ES's --engine (auto: native for low-rank noise on CPU)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--env", default="Countdown-v0", help="training environment (enough training prompts)")
    parser.add_argument("--noise", default="lowrank", choices=["lowrank", "full"])
    parser.add_argument("--rank", type=int, default=1, help="R of low-rank noise")
    parser.add_argument("--population", type=int, default=32, help="N, members per iteration")
    parser.add_argument("--prompts", type=int, default=8, help="training prompts per iteration (ES's --batch-size)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per response at most")
    parser.add_argument("--iterations", type=int, default=2, help="ES iterations per run")
    parser.add_argument("--repeats", type=int, default=3, help="times each layout runs (alternating)")
    parser.add_argument("--processes", type=int, default=2, help="P, processes of the multi-process layout")
    parser.add_argument("--threads", type=int, default=2, help="T, threads in all (1xT against PxT/P)")
    parser.add_argument("--target", type=float, default=1.3, help="the ratio PxT/P over 1xT not to exceed")
    parser.add_argument("--vllm-kv-cache-gb", type=int, default=1, help="--engine vllm: KV cache per process (GiB)")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one, deleted)")
    args = parser.parse_args(argv)
    for name in ("rank", "population", "prompts", "max_new_tokens", "iterations", "repeats", "processes", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1")
    if args.population < 2:
        parser.error("--population: must be >= 2")
    if args.threads % args.processes:
        parser.error(f"--threads {args.threads} must be a multiple of --processes {args.processes}")
    return args


def launch(args, processes: int, out: Path) -> dict:
    """One training run on ``processes`` processes of ``threads / processes`` threads: its
    iteration seconds, the launch's wall time and its update log."""
    threads = args.threads // processes
    es = ["-m", "trainers.es", "--env", args.env, "--model", args.model, "--engine", args.engine, "--noise", args.noise,
          "--rank", str(args.rank), "--population", str(args.population), "--batch-size", str(args.prompts),
          "--max-new-tokens", str(args.max_new_tokens), "--iterations", str(args.iterations), "--eval-every", "0",
          "--eval-limit", str(processes), "--checkpoint-every", str(args.iterations + 1), "--seed", "0",
          "--vllm-kv-cache-gb", str(args.vllm_kv_cache_gb), "--out", str(out)]
    cmd = [sys.executable, *(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
                             if processes > 1 else []), *es]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), "LLM_ENVS_PROGRESS": "lines"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise SystemExit(f"error: the {processes}x{threads} run failed: {lines[-1] if lines else done.returncode}")
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in log if "seconds" in r]
    measured = seconds[1:] or seconds
    return {"iteration_s": statistics.median(measured), "wall_s": wall, "iterations": seconds,
            "updates": [{k: u[k] for k in ("seeds", "coefficients", "rewards")}
                        for u in map(json.loads, (out / "updates.jsonl").read_text().splitlines())]}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    p, t = args.processes, args.threads
    many, one = f"{p}x{t // p}", f"1x{t}"
    print(f"ES {args.noise} on {args.model}, engine {args.engine}, {args.env}: N={args.population} x "
          f"{args.prompts} prompts, up to {args.max_new_tokens} new tokens, {args.iterations} iterations per run; "
          f"{many} ({p} processes of {t // p} threads, torchrun) against {one} (1 process of {t} threads)", flush=True)
    with tempfile.TemporaryDirectory(prefix="es_scale_") as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        ratios, same = [], []
        for r in range(args.repeats):
            order = [(1, one), (p, many)] if r % 2 == 0 else [(p, many), (1, one)]
            got = {}
            for processes, name in order:
                out = root / f"repeat{r + 1}-{name}"
                if out.exists():
                    raise SystemExit(f"error: {out} exists: choose another --out")
                got[name] = launch(args, processes, out)
            ratio = got[many]["iteration_s"] / got[one]["iteration_s"]
            ratios.append(ratio)
            same.append(got[many]["updates"] == got[one]["updates"])
            print(f"repeat {r + 1}: {one} {got[one]['iteration_s']:.2f} s/iteration (launch {got[one]['wall_s']:.0f} s), "
                  f"{many} {got[many]['iteration_s']:.2f} s/iteration (launch {got[many]['wall_s']:.0f} s); "
                  f"{many} / {one} = {ratio:.2f}", flush=True)
    median = statistics.median(ratios)
    verdict = "met" if median <= args.target else "NOT met"
    print(f"median {many} / {one} = {median:.2f} over {args.repeats} repeats (target <= {args.target:g}: {verdict}); "
          f"same updates in both layouts: {sum(same)} of {len(same)} repeats (bit for bit only at equal threads per "
          f"process)")


if __name__ == "__main__":
    main()
