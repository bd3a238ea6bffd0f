"""Learning curves of a study (``--curve-budgets 1024,2048``): once each method's setting is selected
on validation, its grid runs (every seed) are continued, in segments, to each curve budget in turn
(the same run continued: no learning-rate schedule depends on the length, and the seeds and batches
are the run's own). A curve's first point, at ``--max-samples``, is the grid run itself: its record,
not a retrain. While curves are configured the grid runs keep what continuing needs (ES: its update
log, from which the weights are replayed; RL: its newest checkpoint, with the optimizer), and the
curve takes it over (``hand_over``). Where it is gone (a fresh clone: checkpoints are not committed)
the curve retrains the run from the start, and that point says so ("retrained"): on another machine
it is another sample of the seed, not the grid's run. After each segment the run's logged validation
numbers are read and its model is measured on the test split as the grid's runs are. On several
processes (torchrun) every process trains each segment and process 0 measures it.

Verdicts over the curves read the grid's own runs at the first budget. Where the points trained on
different machines (each records them), a verdict must hold on each machine's points alone, else it
is "not shown"; seconds are reported per machine, never mixed (``benchmarks.study.machines``).

Writes ``OUT/curves/METHOD/SETTING/seed=S/curve_record.json`` (one point per budget, kept as each
lands, so a killed study resumes at the next budget) with ``completions-B.jsonl.gz`` beside it (the
first point's completions are its grid run's), and ``learning_curve.md`` / ``learning_curve.png`` /
``curves.json``: test reward and pass@1 against training responses (mean ± std over seeds, one line
per method), what each point cost per machine, claim 1's verdict per budget, and whether ES catches
up: the best ES method at the last budget against the best RL method at the first.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.study.config import LABELS, StudyConfig
from benchmarks.study.machines import machines_line, measured_on, one_machine, shared_labels, trained_on
from benchmarks.study.plan import Run, evaluations, per_step, resume_argv, trainer_argv, trainer_of
from benchmarks.study.record import (brief, commit, final_evaluation, keep_completions, training_machines,
                                     validation_result)
from benchmarks.study.report import pm
from benchmarks.study.run import measure
from benchmarks.study.verdicts import SIGNIFICANT, Study, claim_budget, is_es, per_machine, permutation_p
from eval.passk import mean_std
from eval.table import Table, render
from trainers.common import distributed
from trainers.common.config import ConfigError
from trainers.common.files import atomic_write
from trainers.common.run_dir import RunDir, read_jsonl

RECORD = "curve_record.json"


def budgets(cfg: StudyConfig) -> list[int]:
    """The curve's budgets: ``--max-samples``, then ``--curve-budgets`` (none: no curve)."""
    extra = [int(b) for b in cfg.grid("curve_budgets")] if cfg.curve_budgets else []
    return [cfg.max_samples, *extra] if extra else []


def check_curve_budgets(cfg: StudyConfig) -> None:
    """Each curve budget is a multiple of --max-samples, larger than the one before (a segment then
    ends on a checkpoint of every method, and resumes from it)."""
    points = budgets(cfg)
    for before, b in zip(points, points[1:]):
        if b <= before or b % cfg.max_samples:
            raise ConfigError(f"--curve-budgets {cfg.curve_budgets}: each budget must be a multiple of --max-samples "
                              f"{cfg.max_samples} and larger than the one before ({b} after {before})")


def curve_runs(cfg: StudyConfig, out: Path, chosen: dict[str, dict[str, Any]],
               hparams: dict[tuple[str, str], dict[str, float]]) -> list[Run]:
    """The selected setting of every method, on every seed."""
    return [Run(m, chosen[m]["setting"], hparams[(m, chosen[m]["setting"])], seed,
                out / "curves" / m / chosen[m]["setting"] / f"seed={seed}")
            for seed in range(cfg.seeds) for m in cfg.method_list]


def grid_path(out: Path, run: Run) -> Path:
    """The grid run a curve continues."""
    return out / "runs" / run.method / run.setting / f"seed={run.seed}"


def trained_samples(run: Run) -> int:
    train = [r for r in read_jsonl(run.path / "log.jsonl") if "reward_mean" in r]
    return train[-1]["samples"] if train else 0


#: What a grid run hands its curve besides its checkpoints: the config a resume reads, its logs (the
#: curve's seconds count the grid run's training), the machines it ran on, ES's update log and noise device.
STATE_FILES = ("log.jsonl", "runtime.jsonl", "updates.jsonl", "noise_device.json", "config.yaml")
#: Written into a curve's directory once the grid run's state is handed over (its presence: "continued").
HANDED = "from_grid.json"


def continuable(grid: Path, method: str) -> bool:
    """Whether the grid run at ``grid`` still holds what continuing it needs: its config, and at its
    last logged iteration ES's update log, RL's complete checkpoint."""
    train = [r for r in read_jsonl(grid / "log.jsonl") if "reward_mean" in r]
    if not train or not (grid / "config.yaml").is_file():
        return False
    last = train[-1]["iteration"]
    if is_es(method):
        updates = read_jsonl(grid / "updates.jsonl")
        return bool(updates) and updates[-1]["iteration"] == last
    from trainers.rl.checkpoints import latest_checkpoint

    found = latest_checkpoint(RunDir(grid, resume=True))
    return found is not None and found[0] == last


def hand_over(grid: Path, curve: Path, method: str) -> bool:
    """Give the curve at ``curve`` the grid run's state (its checkpoints moved, its small files copied,
    the config last), so the curve continues the grid run; whether it does. The grid run keeps its
    record and completions. A hand-over cut short is finished on the next call."""
    if (curve / HANDED).is_file():
        return True
    started = (curve / "checkpoints").is_dir() and not (curve / "log.jsonl").is_file()
    if not started and ((curve / "config.yaml").is_file() or not continuable(grid, method)):
        return False  # a curve that retrains (begun before), or a grid run whose state is gone
    curve.mkdir(parents=True, exist_ok=True)
    if (grid / "checkpoints").is_dir():
        shutil.move(str(grid / "checkpoints"), str(curve / "checkpoints"))
    for name in STATE_FILES:
        if (grid / name).is_file():
            shutil.copy2(grid / name, curve / name)
    atomic_write(curve / HANDED, json.dumps({"grid_run": str(grid)}) + "\n")
    return True


def grid_point(record: dict[str, Any], budget: int) -> dict[str, Any]:
    """A curve's first point: its grid run's record (the run the tables report), not measured again."""
    keys = ("method", "label", "setting", "seed", "validation", "greedy", "kl", "measure_seconds",
            "measure_cpu_seconds")
    return {"budget": budget, "grid_run": True, "machines": record.get("machines") or [], "wall_seconds": 0.0,
            **{k: record[k] for k in keys if k in record}}


def continue_to(cfg: StudyConfig, run: Run, budget: int, prompts: int, validation: list[str]) -> None:
    """Train ``run`` (a new one, or resumed from its last checkpoint) until ``budget`` responses, its
    final model measured on validation by the trainer."""
    trainer = trainer_of(run.method)
    steps = budget // per_step(cfg, run.method, prompts)
    every = cfg.max_samples // per_step(cfg, run.method, prompts)  # a checkpoint at every budget's end
    argv = trainer_argv(cfg, run, prompts, validation, budget=budget, checkpoint_every=every)
    log = read_jsonl(run.path / "log.jsonl")
    done = (run.path / "final").is_dir() and trained_samples(run) >= budget and final_evaluation(log) is not None
    done, resuming = distributed.init().from_main((done, (run.path / "config.yaml").is_file()))
    if done:
        return
    if resuming:
        flag = "--iterations" if is_es(run.method) else "--steps"
        argv = [*resume_argv(run, argv), flag, str(steps), "--max-samples", str(budget)]
    trainer.train(trainer.resolve(argv))


def extend(cfg: StudyConfig, run: Run, prompts: int, validation: list[str], cache: Path,
           grid: dict[str, Any] | None = None, groups: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every budget's point of ``run`` (each measured once; a killed study resumes at the next): the
    first is ``grid`` (the grid run's record) where the curve continues it, else a retrained run.
    Several processes: all train each segment, process 0 measures it and returns the points."""
    dist = distributed.init()
    file = run.path / RECORD
    out = run.path.parents[3]
    if dist.is_main and not file.is_file() and grid is not None and hand_over(grid_path(out, run), run.path, run.method):
        atomic_write(file, json.dumps([grid_point(grid, budgets(cfg)[0])], indent=1) + "\n")
    points = dist.from_main(json.loads(file.read_text()) if dist.is_main and file.is_file() else [])
    done = {p["budget"] for p in points}
    for budget in budgets(cfg):
        if budget in done:
            continue
        dist.phase = f"the study's curve {run.label} {run.setting} seed={run.seed} to {budget} responses"
        start = time.perf_counter()
        continue_to(cfg, run, budget, prompts, validation)
        if not dist.is_main:
            dist.wait_for_main()  # while process 0 measures the segment's model and writes its point
            continue
        point = {"method": run.method, "label": run.label, "setting": run.setting, "seed": run.seed,
                 "budget": budget, "validation": validation_result(run), "machines": training_machines(run)}
        if budget == budgets(cfg)[0]:
            point["retrained"] = True  # the grid run's state was gone: another sample of the seed
        measuring, measuring_cpu = time.perf_counter(), time.process_time()
        measured = {name: measure(cfg, str(run.path), run.label, run.path / "eval" / f"b{budget}" / name, options,
                                  cache, groups) for name, options in evaluations(cfg)}
        point.update({name: brief(summary) for name, summary in measured.items()})
        point["measure_seconds"] = time.perf_counter() - measuring
        point["measure_cpu_seconds"] = time.process_time() - measuring_cpu
        point["wall_seconds"] = time.perf_counter() - start  # this invocation's share of the segment
        completions = keep_completions(run.path / f"completions-{budget}.jsonl.gz", measured)
        points.append(point)
        atomic_write(file, json.dumps(points, indent=1) + "\n")
        if cfg.commit:
            commit([file, *([completions] if completions else [])],
                   f"study {out.name}: curve {run.label} {run.setting} seed={run.seed} at {budget}")
        dist.wait_for_main()
    if dist.is_main and not cfg.keep_weights and len(points) == len(budgets(cfg)):
        for sub in ("final", "checkpoints"):
            shutil.rmtree(run.path / sub, ignore_errors=True)
    return points


def train_curves(cfg: StudyConfig, out: Path, records: list[dict[str, Any]], chosen: dict[str, dict[str, Any]],
                 base: dict[str, Any], prompts: int, validation: list[str], cache: Path,
                 groups: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The learning curves of the selected settings (see the module docstring), and their report."""
    hparams = {(r["method"], r["setting"]): r["hparams"] for r in records}
    grid = {(r["method"], r["setting"], r["seed"]): r for r in records}
    points = [p for run in curve_runs(cfg, out, chosen, hparams)
              for p in extend(cfg, run, prompts, validation, cache, grid.get((run.method, run.setting, run.seed)),
                              groups)]
    if distributed.init().is_main:
        write_curves(cfg, out, points, base, records)
    return points


def _key(x: dict[str, Any]) -> tuple[str, str, int]:
    return x["method"], x["setting"], x["seed"]


def placed(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``points`` with the machines each trained on: where a point recorded none (points from before
    they were), the machines that measured its run's points up to it (each segment is measured where
    it trained), flagged ``machines_from_measurements``."""
    out = []
    for p in points:
        if p.get("machines"):
            out.append(p)
            continue
        earlier = [q for q in points if _key(q) == _key(p) and q["budget"] <= p["budget"]]
        seen = {json.dumps(m, sort_keys=True) for q in earlier for m in measured_on(q)}
        out.append(dict(p, machines=[json.loads(m) for m in sorted(seen)], machines_from_measurements=bool(seen)))
    return out


def scored(points: list[dict[str, Any]], records: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
    """The points the verdicts read: at the first budget each curve's grid run (a retrained point is
    replaced by its grid run's record), else the points themselves."""
    grid = {_key(r): r for r in records}
    return [grid_point(grid[_key(p)], first) if p["budget"] == first and not p.get("grid_run") and _key(p) in grid
            else p for p in points]


def repeats_grid(points: list[dict[str, Any]], records: list[dict[str, Any]], budget: int) -> str:
    """How the curves' first points (``budget`` = --max-samples) relate to the grid's runs: how many
    continue their grid run, and for each retrained one whether its greedy test reward repeats the
    grid's (and on which machines, where they differ: bf16 sums differ between CPUs' kernels)."""
    def why(p: dict[str, Any], r: dict[str, Any]) -> str:
        mp, mr = (machines_line(x.get("machines") or []) for x in (p, r))
        return f" (trained on {mp}, the grid's run on {mr})" if mp and mr and mp != mr else ""

    grid = {_key(r): r for r in records}
    first = [p for p in points if p["budget"] == budget and _key(p) in grid]
    continued = [p for p in first if p.get("grid_run")]
    retrained = [p for p in first if not p.get("grid_run")]
    differ = [f"{p['label']} seed {p['seed']}: {p['greedy']['reward_mean']:.4f} against the grid's "
              f"{grid[_key(p)]['greedy']['reward_mean']:.4f}{why(p, grid[_key(p)])}"
              for p in retrained if abs(p["greedy"]["reward_mean"] - grid[_key(p)]["greedy"]["reward_mean"]) > 1e-6]
    text = f"At {budget} responses {len(continued)} of {len(first)} curves continue their grid run"
    if retrained:
        text += (f"; {len(retrained)} retrained it (its state was gone), {len(retrained) - len(differ)} of them "
                 f"repeating the grid's test reward" + (f"; these differ: {'; '.join(differ)}" if differ else "")
                 + ". The verdicts read the grid's runs at this budget")
    return text + "."


def machines_note(points: list[dict[str, Any]]) -> str:
    """Which machines trained the curve's points, counted (a point names every machine its run trained
    on by then); costs are then reported per machine."""
    counts: dict[str, int] = {}
    for p in points:
        line = machines_line(p["machines"]) if p.get("machines") else "not recorded"
        line += " (from its measurements)" if p.get("machines_from_measurements") else ""
        counts[line] = counts.get(line, 0) + 1
    where = "; ".join(f"{line}: {n} point{'s' * (n != 1)}" for line, n in counts.items())
    caveat = " (seconds compare only within one machine: costs are given per machine)" if len(counts) > 1 else ""
    return f"Machines that trained the points{caveat}: {where}."


def machine_of(point: dict[str, Any], shared: frozenset[str] = frozenset()) -> str:
    """The one machine a point trained on, "several machines" (or one of the CPUs that share a label in
    ``shared`` without saying which), or "not recorded"."""
    return one_machine(point, shared) or ("several machines" if trained_on(point) else "an unrecorded machine")


def run_cost(points: list[dict[str, Any]], point: dict[str, Any], cpu: bool = False) -> float | None:
    """The seconds ``point``'s run took to its budget: the training seconds its log holds by then and
    its test measurements so far. ``cpu``: process CPU seconds (None where a point predates them)."""
    mine = [q for q in points if _key(q) == _key(point) and q["budget"] <= point["budget"]]
    if not cpu:
        return point["validation"]["seconds"] + sum(q.get("measure_seconds") or 0.0 for q in mine)
    parts = [point["validation"].get("cpu_seconds"), *(q.get("measure_cpu_seconds") for q in mine)]
    return None if None in parts else sum(parts)


def machine_costs(points: list[dict[str, Any]], method: str, budget: int, cpu: bool = False,
                  shared: frozenset[str] | None = None) -> dict[str, list[float | None]]:
    """Machine -> the seconds per run of ``method``'s curve runs to ``budget`` trained there (machines
    told apart by ``shared``, default ``points``' own ``shared_labels``)."""
    out: dict[str, list[float | None]] = {}
    shared = shared_labels(points) if shared is None else shared
    for p in points:
        if p["method"] == method and p["budget"] == budget:
            out.setdefault(machine_of(p, shared), []).append(run_cost(points, p, cpu))
    return out


def cost_cell(values: list[float | None] | None) -> str:
    """Mean seconds per run over one machine's runs, and how many: "577 (3)"; "–" for none."""
    if not values or None in values:
        return "–"
    return f"{sum(values) / len(values):.0f} ({len(values)})"


def cost_line(points: list[dict[str, Any]], method: str, budget: int, shared: frozenset[str] | None = None) -> str:
    """A method's CPU seconds per run to ``budget``, per machine."""
    found = machine_costs(points, method, budget, cpu=True, shared=shared)
    return ", ".join(f"{cost_cell(v)} on {m}" for m, v in found.items())


def catch_up(points: list[dict[str, Any]], first: int, last: int, cost_points: list[dict[str, Any]] | None = None,
             shared: frozenset[str] | None = None) -> str | None:
    """Does ES catch up with more budget: the best ES method at ``last`` responses against the best RL
    method at ``first`` (best by mean test reward), by the exact permutation test over seeds that the
    claims use. Where the points trained on different machines the verdict must hold on each
    machine's points alone (machines holding only one side's points cannot say). With each side's CPU
    seconds per run per machine (from ``cost_points``, default ``points``) and every method's gain
    from ``first`` to ``last``. None where either side has no points at its budget."""
    def at(method: str, budget: int) -> list[dict[str, Any]]:
        return [p for p in points if p["method"] == method and p["budget"] == budget]

    def rewards(chosen: list[dict[str, Any]]) -> list[float]:
        return [p["greedy"]["reward_mean"] for p in chosen]

    def mean(values: list[float]) -> float:
        return mean_std(values)[0]

    labels = {p["method"]: p["label"] for p in points}
    es = [m for m in labels if is_es(m) and at(m, last)]
    rl = [m for m in labels if not is_es(m) and at(m, first)]
    if not es or not rl or first == last:
        return None
    e = max(es, key=lambda m: mean(rewards(at(m, last))))
    r = max(rl, key=lambda m: mean(rewards(at(m, first))))

    def compare(a: list[float], b: list[float]) -> tuple[str, float, str]:
        p = permutation_p(a, b)
        if p >= SIGNIFICANT:
            return "not shown", p, f"ES - RL = {mean(a) - mean(b):+.3f}, within seed noise (p = {p:.3f})"
        return ("yes", p, f"ES ahead (p = {p:.3f})") if mean(a) > mean(b) else \
            ("no", p, f"RL at {first} still ahead (p = {p:.3f})")

    ours, theirs = at(e, last), at(r, first)
    shared = shared_labels([*points, *(cost_points or [])]) if shared is None else shared
    machines = {machine_of(p, shared) for p in ours + theirs}
    verdict, p, words = compare(rewards(ours), rewards(theirs))
    text = f"{verdict}: {words}"
    if len(machines) > 1:
        found, left = [], []
        for m in sorted(machines):
            a, b = [x for x in ours if machine_of(x, shared) == m], [x for x in theirs if machine_of(x, shared) == m]
            if a and b and m not in ("several machines", "an unrecorded machine"):
                found.append((m, *compare(rewards(a), rewards(b)), len(a), len(b)))
            else:
                left.append(f"{m}: {len(a)} ES and {len(b)} RL points")
        agreed = {v for _, v, *_ in found}
        each = "; ".join(f"on {m}, {na} ES against {nb} RL points: {v}, {w}" for m, v, _, w, na, nb in found)
        if len(agreed) == 1 and "not shown" not in agreed:
            verdict = agreed.pop()
            text = f"{verdict}: on each machine's points alone ({each})"
        else:
            p_each = ", ".join(f"p = {pm_:.3f}" for _, _, pm_, *_ in found) or "no machine holds both sides"
            text = (f"not shown: the verdict must hold on each machine's points alone ({p_each}): "
                    f"{each or 'none'}; pooled over machines, {words}")
        text += f". Left out (one side only, or no single machine): {'; '.join(left)}" if left else ""

    costs_from = cost_points or points
    gains = ", ".join(f"{labels[m]} {mean(rewards(at(m, last))) - mean(rewards(at(m, first))):+.3f}"
                      for m in labels if at(m, first) and at(m, last))
    return (f"Does ES catch up with {last // first}x the budget? {labels[e]} at {last} responses "
            f"{pm(rewards(ours), 3)} against {labels[r]} at {first} responses {pm(rewards(theirs), 3)}: {text}. "
            f"CPU s per run (runs) per machine: {labels[e]} to {last} {cost_line(costs_from, e, last, shared)}; "
            f"{labels[r]} to {first} {cost_line(costs_from, r, first, shared)}. Mean test reward gained from {first} "
            f"to {last} responses: {gains}.")


def study_at(budget: int, points: list[dict[str, Any]], base: dict[str, Any], out: Path) -> Study:
    """The curve's points at ``budget`` as a one-setting study, for the verdict rules."""
    runs = [dict(p, hparams={}) for p in points if p["budget"] == budget]
    methods = {}
    for p in runs:
        m = methods.setdefault(p["method"], {"label": p["label"], "setting": p["setting"], "test_reward": [],
                                              "test_pass@1": []})
        m["test_reward"].append(p["greedy"]["reward_mean"])
        m["test_pass@1"].append(100 * p["greedy"]["pass@1"])
    return Study(out, {"base": base, "methods": methods, "runs": runs})


def write_curves(cfg: StudyConfig, out: Path, points: list[dict[str, Any]], base: dict[str, Any],
                 records: list[dict[str, Any]]) -> None:
    """``learning_curve.md`` (a row per method and budget, the cost per machine, claim 1 per budget,
    how the first budget relates to the grid's runs of ``records``, and whether ES catches up),
    ``learning_curve.png`` and ``curves.json``."""
    first, last = budgets(cfg)[0], budgets(cfg)[-1]
    where = placed(points)
    judged = scored(where, records, first)
    table = Table(f"Learning curves: {base['greedy']['env']} ({cfg.eval_split}), each method's selected setting, "
                  f"mean ± sample std over seeds",
                  ["Method", "Setting", "Training responses", "Seeds", "val " + cfg.metric, "test pass@1 (%)",
                   "test reward"], text_columns=2)
    shared = shared_labels([*where, *judged])  # one census of the CPUs that share a label, for the whole page
    machines = sorted({machine_of(p, shared) for p in where})
    cost = Table("What each run cost to here, per machine that trained it: mean seconds per run (runs)",
                 ["Method", "Training responses", *(f"{kind} s, {m}" for m in machines for kind in ("CPU", "wall"))],
                 text_columns=1)
    for method in cfg.method_list:
        for budget in budgets(cfg):
            at = [p for p in judged if p["method"] == method and p["budget"] == budget]
            if not at:
                continue
            table.rows.append([LABELS[method], at[0]["setting"], str(budget), str(len(at)),
                               pm([p["validation"][cfg.metric] for p in at], 3),
                               pm([100 * p["greedy"]["pass@1"] for p in at]),
                               pm([p["greedy"]["reward_mean"] for p in at], 3)])
            cpu, wall = (machine_costs(where, method, budget, cpu=True, shared=shared),
                         machine_costs(where, method, budget, shared=shared))
            cost.rows.append([LABELS[method], str(budget),
                              *(cost_cell(c.get(m)) for m in machines for c in (cpu, wall))])
    repeats = repeats_grid(where, records, first)
    caught = catch_up(judged, first, last, where, shared)
    verdicts = []
    sides = {is_es(m) for m in cfg.method_list}
    for budget in budgets(cfg):
        if len(sides) < 2:  # claim 1 pairs an ES method with an RL method
            verdicts.append(f"Claim 1 at {budget} responses: untested. The study has {'ES' if True in sides else 'RL'} "
                            f"methods only.")
            continue
        verdict, numbers = per_machine(claim_budget)(study_at(budget, judged, base, out))
        verdicts.append(f"Claim 1 at {budget} responses: {verdict}. {numbers}.")
    table.notes = [f"Base model: test pass@1 {100 * base['greedy']['pass@1']:.1f} %, reward "
                   f"{base['greedy']['reward_mean']:.3f}. At {first} responses the rows are the grid's runs (the "
                   f"curves continue them).", repeats]
    cost.notes = ["Seconds per run to here: the training seconds the run's log holds at this budget (the grid run's "
                  "included) and its test measurements so far, mean over the runs that trained on that machine "
                  "alone. CPU s: process CPU seconds (all threads; 2 threads busy for 1 s count 2), which another "
                  "job sharing the CPU barely changes, unlike wall seconds. – where none ran there, or a run "
                  "predates CPU seconds.", machines_note(where), *verdicts, *([caught] if caught else [])]
    (out / "learning_curve.md").write_text(render([table, cost]))
    plot_learning_curves(cfg, judged, base, out / "learning_curve.png")
    atomic_write(out / "curves.json", json.dumps({"budgets": budgets(cfg), "points": points, "verdicts": verdicts,
                                                  "repeats_grid": repeats, "catch_up": caught},
                                                 indent=1) + "\n")


def plot_learning_curves(cfg: StudyConfig, points: list[dict[str, Any]], base: dict[str, Any], path: Path) -> None:
    """Test reward and pass@1 against training responses: mean ± std over seeds, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (name, value) in zip(axes, (("test reward", lambda p: p["greedy"]["reward_mean"]),
                                        ("test pass@1 (%)", lambda p: 100 * p["greedy"]["pass@1"]))):
        for method in cfg.method_list:
            xs = [b for b in budgets(cfg) if any(p["method"] == method and p["budget"] == b for p in points)]
            stats = [mean_std([value(p) for p in points if p["method"] == method and p["budget"] == b]) for b in xs]
            if not xs:
                continue
            mean = [m for m, _ in stats]
            ax.errorbar(xs, mean, yerr=[s for _, s in stats], marker="o", capsize=3, label=LABELS[method])
        ax.axhline(value({"greedy": base["greedy"]}), color="grey", ls="--", lw=1, label="base model")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training responses")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{base['greedy']['env']}: learning curves (mean ± std over {cfg.seeds} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
