"""Running a study's runs: train one run (or resume it where an earlier invocation stopped),
measure its final model with the eval harness, and write its record once, so a finished run is
never redone."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.study.config import StudyConfig
from benchmarks.study.plan import Run, evaluations, resume_argv, trainer_of
from benchmarks.study.errors import rows_se
from benchmarks.study.record import (COMPLETIONS, brief, commit, final_evaluation, harness_rows, keep_completions,
                                     run_record)
from trainers.common import distributed
from trainers.common.config import build_config
from trainers.common.files import atomic_write
from trainers.common.run_dir import RunDir, read_jsonl

#: A finished run's record, beside its run directory's files: its presence means "done".
RECORD = "study_record.json"


def train_run(cfg: StudyConfig, run: Run, argv: list[str]) -> None:
    """Train ``run`` unless its final model exists and was measured; an interrupted run resumes
    (one killed while measuring its final model only measures it). Several processes: all train,
    on what process 0 found on disk."""
    dist = distributed.init()
    done = (run.path / "final").is_dir() and final_evaluation(read_jsonl(run.path / "log.jsonl")) is not None
    resuming = (run.path / "config.yaml").is_file()
    done, resuming = dist.from_main((done, resuming))
    if done:
        return
    trainer = trainer_of(run.method)
    trainer.train(trainer.resolve(resume_argv(run, argv) if resuming else argv))



def measure(cfg: StudyConfig, model: str, label: str | None, out: Path, options: dict[str, Any],
            cache: Path, groups: dict[str, str] | None = None) -> dict[str, Any]:
    """One harness evaluation on the reported split (its summary is reused if already written;
    generations are cached in the study's own ``cache``), with ``reward_se``, its mean reward's
    standard error over the distinct prompts ``groups`` names (``benchmarks.study.errors``)."""
    from eval.harness import EvalConfig, run

    done = out / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
    else:
        values = dict(env=cfg.env, model=model, split=cfg.eval_split, out=str(out), max_new_tokens=cfg.max_new_tokens,
                      limit=cfg.eval_limit, label=label, env_args=cfg.env_args, device=cfg.device, dtype=cfg.dtype,
                      cache=str(cache), **asdict(cfg.engine_options()), **options)
        if cfg.report_to is not None:  # tracked in the study's group, named as OUT (the cache is OUT/evals/cache)
            values |= dict(report_to=cfg.report_to, report_group=Path(cache).parents[1].name)
        summary = run(build_config(EvalConfig, values))[0]
    if groups is not None and "reward_se" not in summary:
        summary["reward_se"] = rows_se(harness_rows(summary), groups)
    atomic_write(done, json.dumps(summary, indent=1) + "\n")
    return summary


def keep_for_curves(cfg: StudyConfig, run: Run) -> None:
    """What a measured grid run keeps on disk: nothing more than its logs, unless learning curves may
    continue it (``--curve-budgets``): then ES keeps its update log (its whole training result: the
    weights are replayed from it) and RL its newest checkpoint (weights, fp32 masters and optimizer:
    ~1.6 GB for the default model, ~3.2 GB for PPO and its critic) while its setting may still be
    selected (``release``). ``--keep-weights`` keeps everything."""
    if cfg.keep_weights:
        return
    shutil.rmtree(run.path / "final", ignore_errors=True)
    if not cfg.curve_budgets or run.method.startswith("es_"):
        shutil.rmtree(run.path / "checkpoints", ignore_errors=True)
        return
    RunDir(run.path, resume=True).prune_checkpoints(1)


def release(cfg: StudyConfig, runs: list[Run], selected: str) -> None:
    """Whenever a method's setting is selected (after each setting's seeds, and again after a grid
    extension): the checkpoints of its other settings' runs are deleted (unless ``--keep-weights``).
    No curve continues them: the selection is the best mean so far, so a setting that loses now
    never wins later. A study with learning curves then holds two settings' RL checkpoints at most."""
    if cfg.keep_weights:
        return
    for run in runs:
        if run.setting != selected:
            shutil.rmtree(run.path / "checkpoints", ignore_errors=True)



def kept_seconds(before: list[dict[str, Any]], run: Run) -> float:
    """The training seconds of the iterations that earlier invocations logged (``before``, the log as
    this invocation found it) and that the run kept: a resume redoes, and logs anew, the iterations
    after its last checkpoint, so those count once, at this invocation's time. Earlier start-ups and
    held-out evaluations are not logged, so not counted."""
    after = read_jsonl(run.path / "log.jsonl")
    return sum(r.get("seconds", 0.0) for r in before if r in after)


def finish_run(cfg: StudyConfig, run: Run, argv: list[str], bar, cache: Path,
               splits: dict[str, dict[str, int]] | None = None,
               groups: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Train, validate and measure one run (each step skipped when done before); its record
    (several processes: all train, process 0 measures and returns the record, the others None).
    ``groups``: the test items' prompt digests (``benchmarks.study.errors``)."""
    dist = distributed.init()
    record_file = run.path / RECORD
    if dist.from_main(record_file.is_file()):
        bar.update(1 + len(evaluations(cfg)))
        return json.loads(record_file.read_text()) if dist.is_main else None
    bar.set_postfix_str(f"{run.label} {run.setting} seed={run.seed}: training")
    before = read_jsonl(run.path / "log.jsonl")  # a run cut by an earlier invocation: its kept time counts too
    start = time.perf_counter()
    train_run(cfg, run, argv)
    bar.update(1)
    if not dist.is_main:
        dist.wait_for_main()  # while process 0 measures the run and writes its record
        return None
    record = run_record(run, splits)
    if cfg.rule_commit:
        record["rule_commit"] = cfg.rule_commit
    measured = {}
    measuring, measuring_cpu = time.perf_counter(), time.process_time()
    for name, options in evaluations(cfg):
        bar.set_postfix_str(f"{run.label} {run.setting} seed={run.seed}: eval {name}")
        measured[name] = measure(cfg, str(run.path), run.label, run.path / "eval" / name, options, cache, groups)
        record[name] = brief(measured[name])
        bar.update(1)
    # what the test measurements cost, and where: a learning curve's first point is this run
    record["measure_seconds"] = time.perf_counter() - measuring
    record["measure_cpu_seconds"] = time.process_time() - measuring_cpu
    completions = keep_completions(run.path / COMPLETIONS, measured)  # before the record: a record means both
    record["wall_seconds"] = kept_seconds(before, run) + time.perf_counter() - start
    atomic_write(record_file, json.dumps(record, indent=1) + "\n")
    if cfg.commit:
        kept = [record_file, *([completions] if completions else [])]
        commit(kept, f"study {run.path.parents[3].name}: {run.label} {run.setting} seed={run.seed} done")
    keep_for_curves(cfg, run)  # the numbers are on disk; a 7B model per run is not
    dist.wait_for_main()
    return record

