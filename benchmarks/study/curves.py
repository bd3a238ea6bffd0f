"""Learning curves of a study (``--curve-budgets 1024,2048``): once the grid is done and each
method's setting is selected on validation, that setting trains on every seed again, in segments:
to ``--max-samples`` responses, then resumed to each curve budget in turn (the same run continued:
no learning-rate schedule depends on the length, and the seeds and batches are the run's own).
After each segment the run's logged validation numbers are read and its model is measured on the
test split as the grid's runs are, so every budget has validation, test and sampled numbers.
On several processes (torchrun) every process trains each segment and process 0 measures it, as
for the grid's runs.

The first segment retrains what the grid's run of that setting trained (its weights were deleted
once measured), so the curve's first point must repeat the grid's numbers: a check that the
curve continues the run the tables report (``learning_curve.md`` counts the points that do).

Writes ``OUT/curves/METHOD/SETTING/seed=S/curve_record.json`` (one point per budget, kept as each
lands, so a killed study resumes at the next budget) with ``completions-B.jsonl.gz`` beside it,
and ``learning_curve.md`` / ``learning_curve.png`` / ``curves.json``: test reward and pass@1 against
training responses (mean ± std over seeds, one line per method), claim 1's verdict per budget, and
whether ES catches up: the best ES method at the last budget against the best RL method at the first,
with what each cost in CPU seconds.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.study.config import LABELS, StudyConfig
from benchmarks.study.plan import Run, evaluations, per_step, resume_argv, trainer_argv, trainer_of
from benchmarks.study.record import (brief, commit, final_evaluation, keep_completions, training_machines,
                                     validation_result)
from benchmarks.study.report import machine_label, pm
from benchmarks.study.run import measure
from benchmarks.study.verdicts import ES, SIGNIFICANT, Study, claim_budget, permutation_p
from eval.passk import mean_std
from eval.table import Table, render
from trainers.common import distributed
from trainers.common.config import ConfigError
from trainers.common.files import atomic_write
from trainers.common.run_dir import read_jsonl

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


def trained_samples(run: Run) -> int:
    train = [r for r in read_jsonl(run.path / "log.jsonl") if "reward_mean" in r]
    return train[-1]["samples"] if train else 0


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
        flag = "--iterations" if run.method.startswith("es_") else "--steps"
        argv = [*resume_argv(run, argv), flag, str(steps), "--max-samples", str(budget)]
    trainer.train(trainer.resolve(argv))


def extend(cfg: StudyConfig, run: Run, prompts: int, validation: list[str], cache: Path) -> list[dict[str, Any]]:
    """Every budget's point of ``run`` (each measured once; a killed study resumes at the next).
    Several processes: all train each segment, process 0 measures it and returns the points."""
    dist = distributed.init()
    file = run.path / RECORD
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
        measuring, measuring_cpu = time.perf_counter(), time.process_time()
        measured = {name: measure(cfg, str(run.path), run.label, run.path / "eval" / f"b{budget}" / name, options,
                                  cache) for name, options in evaluations(cfg)}
        point.update({name: brief(summary) for name, summary in measured.items()})
        point["measure_seconds"] = time.perf_counter() - measuring
        point["measure_cpu_seconds"] = time.process_time() - measuring_cpu
        point["wall_seconds"] = time.perf_counter() - start  # this invocation's share of the segment
        completions = keep_completions(run.path / f"completions-{budget}.jsonl.gz", measured)
        points.append(point)
        atomic_write(file, json.dumps(points, indent=1) + "\n")
        if cfg.commit:
            commit([file, *([completions] if completions else [])],
                   f"study {run.path.parents[3].name}: curve {run.label} {run.setting} seed={run.seed} at {budget}")
        dist.wait_for_main()
    if dist.is_main and not cfg.keep_weights and len(points) == len(budgets(cfg)):
        for sub in ("final", "checkpoints"):
            shutil.rmtree(run.path / sub, ignore_errors=True)
    return points


def train_curves(cfg: StudyConfig, out: Path, records: list[dict[str, Any]], chosen: dict[str, dict[str, Any]],
               base: dict[str, Any], prompts: int, validation: list[str], cache: Path) -> list[dict[str, Any]]:
    """The learning curves of the selected settings (see the module docstring), and their report."""
    hparams = {(r["method"], r["setting"]): r["hparams"] for r in records}
    points = [p for run in curve_runs(cfg, out, chosen, hparams) for p in extend(cfg, run, prompts, validation, cache)]
    if distributed.init().is_main:
        write_curves(cfg, out, points, base, records)
    return points


def machines_line(machines: list[dict[str, Any]]) -> str:
    """A run's recorded machines (``training_machines``) in one line, without thread counts."""
    return " and ".join(machine_label(m) for m in machines)


def repeats_grid(points: list[dict[str, Any]], records: list[dict[str, Any]], budget: int) -> str:
    """Whether the curve's first points (``budget`` = --max-samples) repeat the grid's runs they retrain:
    the count of points whose greedy test reward equals their grid run's, and any that differ."""
    def key(x: dict[str, Any]) -> tuple[str, str, int]:
        return x["method"], x["setting"], x["seed"]

    def why(p: dict[str, Any], r: dict[str, Any]) -> str:  # bf16 kernels differ between CPUs, so do their sums
        mp, mr = (machines_line(x.get("machines") or []) for x in (p, r))
        return f" (trained on {mp}, the grid's run on {mr})" if mp and mr and mp != mr else ""

    grid = {key(r): r for r in records}
    first = [p for p in points if p["budget"] == budget and key(p) in grid]
    differ = [f"{p['label']} seed {p['seed']}: {p['greedy']['reward_mean']:.4f} against the grid's "
              f"{grid[key(p)]['greedy']['reward_mean']:.4f}{why(p, grid[key(p)])}"
              for p in first if abs(p["greedy"]["reward_mean"] - grid[key(p)]["greedy"]["reward_mean"]) > 1e-6]
    return (f"At {budget} responses each curve retrains its grid run: {len(first) - len(differ)} of {len(first)} "
            f"points repeat the grid's test reward" + (f"; these differ: {'; '.join(differ)}" if differ else "") + ".")


def machines_note(points: list[dict[str, Any]]) -> str:
    """Which machines trained the curve's points, counted, since seconds compare only within one machine
    (a point records every machine its run trained on by then; points from before that was recorded: none)."""
    counts: dict[str, int] = {}
    for p in points:
        line = machines_line(p["machines"]) if p.get("machines") else "not recorded"
        counts[line] = counts.get(line, 0) + 1
    where = "; ".join(f"{line}: {n} point{'s' * (n != 1)}" for line, n in counts.items())
    caveat = " (seconds per run then average over machines)" if len(counts) > 1 else ""
    return f"Machines that trained the points{caveat}: {where}."


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


def cumulative(points: list[dict[str, Any]], method: str, budget: int, cpu: bool = False) -> float | None:
    """Seconds of ``method``'s curve runs (all seeds) up to ``budget``: the training seconds their logs
    hold by then (every invocation's, a killed one's included) and the test measurements so far.
    ``cpu``: process CPU seconds instead of wall seconds (None where a point predates them)."""
    at = [p for p in points if p["method"] == method and p["budget"] <= budget]
    if not cpu:
        trained = sum(p["validation"]["seconds"] for p in at if p["budget"] == budget)
        return trained + sum(p.get("measure_seconds", 0.0) for p in at)
    trained = [p["validation"].get("cpu_seconds") for p in at if p["budget"] == budget]
    measured = [p.get("measure_cpu_seconds") for p in at]
    if None in trained or None in measured:
        return None
    return sum(trained) + sum(measured)


def catch_up(points: list[dict[str, Any]], first: int, last: int) -> str | None:
    """Does ES catch up with more budget: the best ES method at ``last`` responses against the best RL
    method at ``first`` (best by mean test reward), by the exact permutation test over seeds that the
    claims use, with each side's CPU seconds per run to there and every method's gain from ``first``
    to ``last``. None where either side has no points at its budget."""
    def rewards(method: str, budget: int) -> list[float]:
        return [p["greedy"]["reward_mean"] for p in points if p["method"] == method and p["budget"] == budget]

    def mean(values: list[float]) -> float:
        return mean_std(values)[0]

    labels = {p["method"]: p["label"] for p in points}
    es = [m for m in labels if m in ES and rewards(m, last)]
    rl = [m for m in labels if m not in ES and rewards(m, first)]
    if not es or not rl or first == last:
        return None
    e = max(es, key=lambda m: mean(rewards(m, last)))
    r = max(rl, key=lambda m: mean(rewards(m, first)))
    a, b = rewards(e, last), rewards(r, first)
    p = permutation_p(a, b)
    if p >= SIGNIFICANT:
        verdict = f"not shown: ES - RL = {mean(a) - mean(b):+.3f}, within seed noise (p = {p:.3f})"
    elif mean(a) > mean(b):
        verdict = f"yes: ES ahead (p = {p:.3f})"
    else:
        verdict = f"no: RL at {first} still ahead (p = {p:.3f})"

    def side(method: str, budget: int, values: list[float]) -> str:
        cpu = cumulative(points, method, budget, cpu=True)
        cost = "" if cpu is None else f", {cpu / len(values):.0f} CPU s per run"
        return f"{labels[method]} at {budget} responses {pm(values, 3)}{cost}"

    gains = ", ".join(f"{labels[m]} {mean(rewards(m, last)) - mean(rewards(m, first)):+.3f}"
                      for m in labels if rewards(m, first) and rewards(m, last))
    return (f"Does ES catch up with {last // first}x the budget? {side(e, last, a)} against {side(r, first, b)}: "
            f"{verdict}. Mean test reward gained from {first} to {last} responses: {gains}.")


def cpu_cell(total: float | None, runs: int) -> str:
    return "–" if total is None else f"{total / runs:.0f}"


def write_curves(cfg: StudyConfig, out: Path, points: list[dict[str, Any]], base: dict[str, Any],
                 records: list[dict[str, Any]]) -> None:
    """``learning_curve.md`` (a row per method and budget, claim 1 per budget, whether the first budget
    repeats the grid's runs of ``records``, and whether ES catches up), ``learning_curve.png`` and ``curves.json``."""
    table = Table(f"Learning curves: {base['greedy']['env']} ({cfg.eval_split}), each method's selected setting, "
                  f"mean ± sample std over seeds",
                  ["Method", "Setting", "Training responses", "Seeds", "val " + cfg.metric, "test pass@1 (%)",
                   "test reward", "s per run to here", "CPU s per run to here"], text_columns=2)
    for method in cfg.method_list:
        for budget in budgets(cfg):
            at = [p for p in points if p["method"] == method and p["budget"] == budget]
            if not at:
                continue
            table.rows.append([LABELS[method], at[0]["setting"], str(budget), str(len(at)),
                               pm([p["validation"][cfg.metric] for p in at], 3),
                               pm([100 * p["greedy"]["pass@1"] for p in at]),
                               pm([p["greedy"]["reward_mean"] for p in at], 3),
                               f"{cumulative(points, method, budget) / len(at):.0f}",
                               cpu_cell(cumulative(points, method, budget, cpu=True), len(at))])
    repeats = repeats_grid(points, records, budgets(cfg)[0])
    caught = catch_up(points, budgets(cfg)[0], budgets(cfg)[-1])
    verdicts = []
    for budget in budgets(cfg):
        verdict, numbers = claim_budget(study_at(budget, points, base, out))
        verdicts.append(f"Claim 1 at {budget} responses: {verdict}. {numbers}.")
    table.notes = [f"Base model: test pass@1 {100 * base['greedy']['pass@1']:.1f} %, reward "
                   f"{base['greedy']['reward_mean']:.3f}. Seconds per run to here: the training seconds the run's log "
                   f"holds at this budget and its test measurements so far, mean over seeds (the first segment "
                   f"retrains what the grid's run trained): what each method's curve costs. CPU s: the same, in "
                   f"process CPU seconds (all threads; 2 threads busy for 1 s count 2), which another job sharing "
                   f"the CPU barely changes, unlike wall seconds.",
                   machines_note(points), repeats, *verdicts, *([caught] if caught else [])]
    (out / "learning_curve.md").write_text(render([table]))
    plot_learning_curves(cfg, points, base, out / "learning_curve.png")
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
