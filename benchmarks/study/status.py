"""Where a study stands, without starting anything: the study's own command line, with
``study_status`` in place of ``study``, prints the runs and learning-curve points done and left,
and the time left, estimated from the runs finished so far.

    python -m benchmarks.study.status --config benchmarks/configs/study_rg_arithmetic_round2_cpu.yaml \\
        --out docs/study-rg-arithmetic-r2

The estimate uses each method's median over its finished runs (a median, so that one run that
was paused or shared the CPU does not decide it): its training seconds, and the rest of its wall
time (start-up, the final model's measurements). A run's training seconds are its iterations
times their median where its log is on this machine (one paused iteration does not decide them
either), else its record's sum (a fresh clone has the records only). A curve's first point is its
grid run (nothing left to do); a segment from budget b0 to b trains (b - b0) / --max-samples times a
grid run's training and is measured once. Runs that extended a grid beyond its edge
(``--extend-grids``) are counted once they are on disk (which ones run depends on the selection); once a
method's grid is done, the runs its selection extends it by are next, as the driver runs them. A
method with no finished run but a started one is estimated provisionally: its logged iterations'
median times the run's iterations, plus the other methods' median start-up and measuring (the same
model, measured the same way); the output marks it. A method with neither is left out of the
estimate, and the output says so (with no method left to estimate from, it says there is no
estimate). While the grid runs, it also prints each setting's numbers so far: the seeds done, their
mean validation pass@1 and their mean test pass@1 and reward. A study pinned to one machine
(``--machine``, ``--cpu-model``) is told whether this machine may resume it.
"""

from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.study.config import LABELS, StudyConfig
from benchmarks.study.curves import RECORD as CURVE_RECORD
from benchmarks.study.curves import budgets
from benchmarks.study.machines import pins, this_cpu_model_words
from benchmarks.study.plan import Run, extension, plan
from benchmarks.study.record import select
from benchmarks.study.run import RECORD
from trainers.common.config import ConfigError, load_yaml, parse_config, run_main
from trainers.common.models import resolve_device
from trainers.common.run_dir import read_jsonl


@dataclass
class Cost:
    """A method's median seconds per grid run: training, and everything else (start-up, measuring)."""
    train: float
    other: float


def iteration_seconds(path: Path) -> list[float]:
    """The seconds of each training iteration (ES) or step (RL) a run's log holds."""
    return [r["seconds"] for r in read_jsonl(path / "log.jsonl") if "reward_mean" in r and "seconds" in r]


def training_seconds(record: dict, path: Path) -> float:
    """A finished run's training seconds (see the module docstring)."""
    its = iteration_seconds(path)
    return len(its) * statistics.median(its) if its else record["validation"]["seconds"]


def costs(finished: list[tuple[dict, Path]]) -> dict[str, Cost]:
    """Each method's ``Cost``, from its finished runs: (record, run directory)."""
    by_method: dict[str, list[Cost]] = {}
    for record, path in finished:
        other = record["wall_seconds"] - record["validation"]["seconds"]  # the record's own sum: pauses cancel
        by_method.setdefault(record["method"], []).append(Cost(training_seconds(record, path), other))
    return {m: Cost(statistics.median(c.train for c in cs), statistics.median(c.other for c in cs))
            for m, cs in by_method.items()}


def provisional(runs: list[Run], cost: dict[str, Cost]) -> dict[str, tuple[Cost, int]]:
    """A ``Cost`` for each method with no finished run but a started one whose log has iterations
    (see the module docstring), with the number of iterations it rests on."""
    others = [c.other for c in cost.values()]
    started: dict[str, tuple[Cost, int]] = {}
    for run in runs:
        if run.method in cost or run.method in started or not (run.path / "config.yaml").is_file():
            continue
        its = iteration_seconds(run.path)
        total = iterations(run.path)[1]
        if its and total:
            started[run.method] = (Cost(total * statistics.median(its), statistics.median(others) if others else 0.0),
                                   len(its))
    return started


def measured_budgets(out: Path, method: str, seed: int) -> set[int]:
    """The budgets already measured on the curve of ``method``'s selected setting, ``seed``."""
    files = list((out / "curves" / method).glob(f"*/seed={seed}/{CURVE_RECORD}"))
    return {p["budget"] for f in files for p in json.loads(f.read_text())}


def status(cfg: StudyConfig, out: Path) -> str:
    """The report: runs done, curve points done, time left (see the module docstring)."""
    if not (out / "study.json").is_file():
        return f"{out}: no study there yet (study.json missing); the study's command starts it"
    runs = plan(cfg, out)
    planned = {r.path for r in runs}
    beyond = [p.parent for p in sorted(out.glob(f"runs/*/*/*/{RECORD}")) if p.parent not in planned]
    finished = [(json.loads((path / RECORD).read_text()), path)
                for path in [*(r.path for r in runs), *beyond] if (path / RECORD).is_file()]
    records = [record for record, _ in finished]
    cost = costs(finished)
    guessed = provisional(runs, cost)
    cost |= {method: c for method, (c, _) in guessed.items()}
    left = runs_left(cfg, out, runs, records)
    grid_left = sum(cost[r.method].train + cost[r.method].other for r in left if r.method in cost)

    points = budgets(cfg)
    curve_done, curve_left, curve_next = 0, 0.0, None
    for seed in range(cfg.seeds):  # the order the curves run in
        for method in cfg.method_list:
            measured = measured_budgets(out, method, seed)
            curve_done += len(measured & set(points))
            missing = [b for b in points if b not in measured]
            if missing and curve_next is None:
                curve_next = f"the curve of {LABELS[method]} seed={seed} to {missing[0]} responses"
            if method not in cost:
                continue
            curve_left += sum(cost[method].train * (b - b0) / cfg.max_samples + cost[method].other
                              for b0, b in zip(points, points[1:]) if b not in measured)

    lines = [f"study {out}: grid {len(records) - len(beyond)} of {len(runs)} runs done"
             + (f" (and {len(beyond)} beyond the grids' edges)" if beyond else "")
             + (f"; learning curves {curve_done} of {len(points) * cfg.seeds * len(cfg.method_list)} points "
                f"(budgets {', '.join(map(str, points))}), after the grid" if points else "")]
    # Only --machine needs the device, and resolving a CUDA study's device fails on a machine without one.
    found = pins(cfg.machine, resolve_device(cfg.device) if cfg.machine else None, cfg.cpu_model)
    failing = [p.flag for p in found if not p.holds]
    for pin in found:
        if not pin.holds:
            verdict = f"{pin.here}, so the study's command refuses to run here"
        elif failing:
            verdict = f"this machine, but {failing[0]} is not, so the study's command refuses to run here"
        else:
            verdict = "this machine, so the study's command resumes it here"
        lines.append(f"pinned to {pin.pinned} ({pin.flag}): {verdict}")
    if cfg.machine and not cfg.cpu_model:
        lines.append(f"this CPU is {this_cpu_model_words()} (--cpu-model pins a study to it)")
    if left:
        nxt = left[0]
        lines.append(f"next or running: {nxt.label} {nxt.setting} seed={nxt.seed}{progress(nxt.path)}")
    elif curve_next:
        lines.append(f"next or running: {curve_next}")
    counted = [m for m in cfg.method_list if m in cost]
    complete = not left and curve_done == len(points) * cfg.seeds * len(cfg.method_list)
    if complete:
        lines.append("nothing left: the same command renders the report")
    elif not counted:  # an estimate over no method would read "0 min"
        lines.append("time left on this machine: not estimated until a run of some method has finished or "
                     "logged an iteration")
    else:
        lines.append("time left on this machine, estimated from the finished runs"
                     + (f" ({', '.join(LABELS[m] for m in guessed)} provisionally, from a started run)" if guessed else "")
                     + f": grid {hours(grid_left)}"
                     + (f", curves {hours(curve_left)}, total {hours(grid_left + curve_left)}" if points else "")
                     + ("" if len(counted) == len(cfg.method_list) else
                        f"; without {', '.join(LABELS[m] for m in cfg.method_list if m not in cost)} "
                        f"(no finished run to estimate from)"))
    for method in counted:
        c, n = cost[method], sum(r["method"] == method for r in records)
        if method in guessed:
            lines.append(f"  {LABELS[method]}: runs done 0, per run (provisional, from {guessed[method][1]} logged "
                         f"iterations of a started run) {c.train / 60:.1f} min training + {c.other / 60:.1f} min "
                         "start-up and measuring (the other methods' median)")
            continue
        lines.append(f"  {LABELS[method]}: runs done {n}, per run (median) {c.train / 60:.1f} min training + "
                     f"{c.other / 60:.1f} min start-up and measuring")
    if left and records:
        lines += ["finished settings so far (means over the seeds done; the study selects on validation once "
                  "the grid is done):", *so_far(runs, records)]
    return "\n".join(lines)


def runs_left(cfg: StudyConfig, out: Path, runs: list[Run], records: list[dict]) -> list[Run]:
    """The grid runs not finished, in the driver's order: method by method, each method's grid and
    then, once that grid is done, the runs one step beyond its edge where its selection sits
    (``plan.extension``, as the driver adds them: ``--extend-grids`` rounds at most)."""
    done = {(r["method"], r["setting"], r["seed"]) for r in records}
    left = []
    for method in cfg.method_list:
        todo = [r for r in runs if r.method == method and (r.method, r.setting, r.seed) not in done]
        # what the driver knew when it extended: the grid's records, then each finished round's
        known = [r for r in records if r["method"] == method and not r.get("extension")]
        while not todo and cfg.extend_grids and known:
            more = extension(cfg, out, method, known, select(cfg, known, [method])[method]["setting"])
            if not more:
                break
            todo = [r for r in more if (r.method, r.setting, r.seed) not in done]
            settings = {r.setting for r in more}
            known += [r for r in records if r["method"] == method and r["setting"] in settings]
        left += todo
    return left


def so_far(runs: list[Run], records: list[dict]) -> list[str]:
    """One line per setting with a finished run: its seeds done, their mean validation pass@1 and
    their mean test pass@1 and reward (greedy), then each seed's test / validation pass@1; in the
    plan's order (the study's methods, each method's settings in the grid's order, then those beyond
    its edge)."""
    keys = list(dict.fromkeys((r.method, r.setting) for r in runs))
    for r in records:
        key = (r["method"], r["setting"])
        if key not in keys:  # a setting beyond the grid's edge: after its method's grid
            keys.insert(max(i for i, k in enumerate(keys) if k[0] == key[0]) + 1, key)
    by_setting: dict[tuple[str, str], list[dict]] = {key: [] for key in keys}
    for r in sorted(records, key=lambda r: r["seed"]):
        by_setting[r["method"], r["setting"]].append(r)
    lines = []
    for (method, setting), rs in by_setting.items():
        if not rs:
            continue

        def mean(part: str, key: str) -> float:
            return statistics.fmean(r[part][key] for r in rs)
        each = ", ".join(f"{r['greedy']['pass@1']:.2f} / {r['validation']['eval_pass@1']:.2f}" for r in rs)
        lines.append(f"  {LABELS[method]} {setting}, seeds {', '.join(str(r['seed']) for r in rs)}: validation "
                     f"pass@1 {mean('validation', 'eval_pass@1'):.3f}; test pass@1 {mean('greedy', 'pass@1'):.3f}, "
                     f"reward {mean('greedy', 'reward_mean'):.3f} (each seed's test / validation pass@1: {each})")
    return lines


def iterations(path: Path) -> tuple[str, int | None]:
    """A started run's unit ("iterations" for ES, "steps" for RL) and how many it trains, from its config."""
    saved = load_yaml(path / "config.yaml")
    return ("iterations", saved.get("iterations")) if "iterations" in saved else ("steps", saved.get("steps"))


def progress(path: Path) -> str:
    """How far a started run's log goes, e.g. " (3 of 8 iterations logged)"; "" for a run not started."""
    if not (path / "config.yaml").is_file():
        return ""
    unit, total = iterations(path)
    logged = sum("reward_mean" in r for r in read_jsonl(path / "log.jsonl"))
    return f" ({logged} of {total} {unit} logged)"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main(argv: list[str] | None = None) -> str:
    def report(cfg: StudyConfig) -> str:
        if not cfg.out:
            raise ConfigError("--out: the study's directory (the --out its own command was given)")
        text = status(cfg, Path(cfg.out))
        print(text)
        return text

    return run_main(functools.partial(parse_config, StudyConfig, description=__doc__.split("\n\n")[0]), report, argv)


if __name__ == "__main__":
    main()
