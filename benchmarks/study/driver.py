"""Test the paper's claims in one command: ES (full-rank and low-rank) against GRPO, Dr.GRPO and PPO
on one environment, over seeds and small hyperparameter grids, at an equal sample budget.

    python -m benchmarks.study --env Conciseness-v0 --seeds 4 --max-samples 256 --out runs/study
    python -m benchmarks.study --config benchmarks/configs/study_conciseness_cpu.yaml
    python -m benchmarks.study --config benchmarks/configs/study_countdown_qwen2.5-7b.yaml  # the paper's GPU setting

The protocol, as in the paper:
- Every method trains the same model on the same environment, training prompts, generation budget
  (``--max-new-tokens``) and held-out split, and generates the whole steps that fit
  ``--max-samples`` (no run exceeds it); methods whose actual budgets differ by more than one step
  of the method with the smallest step are refused unless ``--unequal-budgets``, and the tables
  report each method's actual training responses.
- ES runs one fixed setting per sigma of a small grid (``--sigmas``), alpha = ``--alpha-ratio`` x
  sigma (the paper's Conciseness runs: sigma/2). The RL methods run the grid beta x learning rate
  (``--betas`` with a beta = 0 arm, ``--lrs``). Every grid point runs every seed and is recorded.
- Each method's setting is selected on a validation split, never on the test split: the env's own
  ``validation`` split, else one carved from train (``--val-size``), else, for train splits too
  small to carve (Conciseness-v0 has 2 prompts), the training prompts themselves.
- Every final model and the base model are measured by the eval harness (``eval.harness``) on the
  test split: greedy pass@1, and ``--kl-samples`` sampled responses per prompt at temperature 1
  with KL to the base model (Conciseness-v0: the paper's 20).

Writes under OUT: ``table1.md`` (test pass@1 per method, mean ± std over seeds, at its selected
setting), ``table2.md`` (the paper's Table 2 layout: reward and KL, mean ± std over seeds, per
method and setting), ``runs.md`` (every run: validation, test, KL, reward-hacking flag),
``seed_variance.md``, ``pareto-ENV-SPLIT.png`` (every seed's model, each method's front),
``curves.png`` (training reward against samples, mean and band over seeds) and ``results.json``
(every number). Runs live in OUT/runs/METHOD/SETTING/seed=S (each keeps ``study_record.json`` and
its evaluated completions, ``completions.jsonl.gz``: ``benchmarks.study.evidence`` counts and rescores
them), evaluations in OUT/evals (with ``test_prompts.json``: the test items' prompt digests, for the
errors over distinct prompts, ``benchmarks.study.errors``). ``--curve-budgets`` then continues each
method's selected grid runs to larger budgets (``benchmarks.study.curves``). ``--rule-commit``
records the commit of a pre-registered rule in study.json and every record. A killed study resumes where it stopped when run
again with the same arguments: finished runs and evaluations are not redone, an unfinished run
resumes from its last checkpoint.

This module is the driver; what a study is lives in ``study_config`` (options, identity, dtype),
its runs and their flags in ``study_plan``, training and measuring one run in ``study_run``, what is
kept of it in ``study_record``, and the tables in ``study_report``.

Several processes (``torchrun --nproc-per-node G -m benchmarks.study ...``): every run trains on all
G processes (ES: members split over them, one engine each; RL: FSDP2), and process 0 alone runs
the harness's measurements and writes the records and the report while the others wait. ES runs
give the numbers of one process bit for bit, RL runs agree within float rounding
(``docs/scale-out.md``). The harness on process 0 cannot build a vLLM engine inside the others'
launch (vLLM's engine in a launched group joins every rank), so ``--engine vllm`` is refused there.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.study.config import (AUTO_ENGINE, DEFAULT_METHODS, LABELS, METHODS, StudyConfig, changed_options,
                                     identity, settle_study_runtime)
from benchmarks.study.curves import budgets as curve_budgets
from benchmarks.study.curves import check_curve_budgets, train_curves
from benchmarks.study.errors import TEST_PROMPTS, prompt_groups, write_test_prompts
from benchmarks.study.machines import check_machine
from benchmarks.study.plan import (Run, check_budgets, evaluations, extension, per_step, plan, prompts_per_step,
                                   split_plan, trainer_argv, trainer_of, validation_plan)
from benchmarks.study.record import COMPLETIONS, brief, check_device, commit, keep_completions, pinned_rule, select
from benchmarks.study.report import ORIGINAL, run_hacked, write_report
from benchmarks.study.run import finish_run, measure, release
from trainers.common.rollout import eval_examples
from trainers.common import distributed
from trainers.common.config import ConfigError, make_env, parse_config, run_main
from trainers.common.files import atomic_write
from trainers.common.models import resolve_device
from trainers.common.progress import bar as progress_bar

__all__ = ["AUTO_ENGINE", "DEFAULT_METHODS", "LABELS", "METHODS", "StudyConfig", "main", "study"]


def study(cfg: StudyConfig) -> Path:
    dist = distributed.init()
    if dist.world > 1 and cfg.engine == "vllm":
        raise ConfigError(f"--engine vllm: the harness's measurements run on process 0 alone, and a vLLM engine "
                          f"started there joins all {dist.world} processes of this launch; use --engine native or "
                          f"hf with several processes, or run the study on one process")
    check_curve_budgets(cfg)
    if cfg.rule_commit:  # the pre-registered rule, by its full commit id (an abbreviation resumes the same study)
        cfg.rule_commit = dist.from_main(pinned_rule(cfg.rule_commit) if dist.is_main else None)
    env = make_env(cfg.env, cfg.env_args, splits=("train",))  # bad options end here, before OUT exists
    try:
        env.examples(cfg.eval_split)
    except KeyError as exc:
        raise ConfigError(f"--eval-split: {exc.args[0]}") from None
    selected_on, validation = validation_plan(cfg, env)
    splits = split_plan(cfg, env, selected_on, validation)
    prompts = prompts_per_step(cfg, splits["train"]["examples"])
    for method in cfg.method_list:
        need = per_step(cfg, method, prompts)
        if cfg.max_samples < need:
            raise ConfigError(f"--max-samples {cfg.max_samples} is less than one {LABELS[method]} "
                              f"{'iteration' if method.startswith('es_') else 'step'} ({need} responses: "
                              f"{prompts} prompts x {need // prompts}); raise it or shrink the population/group")
    check_budgets(cfg, prompts)
    groups = prompt_groups(eval_examples(env, cfg.eval_split, cfg.eval_limit))  # the test set's distinct prompts
    env.close()
    out = Path(dist.from_main(cfg.out or f"runs/study-{cfg.env}-{time.strftime('%Y%m%d-%H%M%S')}"))
    saved = out / "study.json"
    # process 0 reads it and every process gets its copy: another process must never read the file
    # while process 0 writes it below
    previous = dist.from_main(json.loads(saved.read_text()) if dist.is_main and saved.is_file() else None)
    settle_study_runtime(cfg, previous, dist)  # dtype and engine: process 0 decides, every process gets it
    check_machine(cfg.machine, resolve_device(cfg.device), cfg.cpu_model)  # before anything runs, as the two above
    own = identity(cfg)
    if previous is not None:
        changed = changed_options(previous, own, curves_started=any(out.glob("curves/**/curve_record.json")))
        if changed:
            raise ConfigError(f"--out {out}: holds a study with other options ({', '.join(changed)}); "
                              f"use another --out, or the same options to resume it")
        check_device(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    if dist.is_main:
        atomic_write(saved, json.dumps(own, indent=1) + "\n")
        write_test_prompts(out, groups, cfg.eval_split, cfg.eval_limit)
    runs = plan(cfg, out)
    argvs = [trainer_argv(cfg, run, prompts, validation) for run in runs]
    checked = set()
    for run, argv in zip(runs, argvs):  # each method's flags checked before the first run starts
        if run.method not in checked:
            trainer_of(run.method).resolve(argv)
            checked.add(run.method)

    start = time.perf_counter()
    units = len(runs) * (1 + len(evaluations(cfg))) + len(evaluations(cfg))
    bar = progress_bar(total=units, desc="study", unit="step", run=True, disable=not dist.is_main)
    base, cache = {}, out / "evals" / "cache"
    for name, options in evaluations(cfg):
        bar.set_postfix_str(f"base model: eval {name}")
        if dist.is_main:
            where = out / "evals" / "base" / name
            summary = measure(cfg, cfg.model, ORIGINAL, where, options, cache, groups)
            base[name] = brief(summary)
            keep_completions(where / COMPLETIONS, {name: summary})
            if cfg.commit:
                commit([out / "study.json", out / TEST_PROMPTS, where / "summary.json", where / COMPLETIONS],
                       f"study {out.name}: the base model's {name} evaluation")
        bar.update(1)
    dist.wait_for_main()

    def finish(batch: list[Run]) -> list[dict]:
        done = []
        for run in batch:
            dist.phase = f"the study's run {run.label} {run.setting} seed={run.seed}"
            record = finish_run(cfg, run, trainer_argv(cfg, run, prompts, validation), bar, cache, splits, groups)
            if record is not None:
                record["hacked"] = run_hacked(record, base.get("kl"))
                done.append(record)
        return done

    records = []
    for method in cfg.method_list:  # method by method, setting by setting (each on every seed)
        mine = [run for run in runs if run.method == method]
        batches = [[run for run in mine if run.setting == s] for s in dict.fromkeys(run.setting for run in mine)]
        finished: list[Run] = []
        while batches:
            finished += batches[0]
            records += finish(batches.pop(0))
            selected = dist.from_main(select(cfg, records, [method])[method]["setting"] if dist.is_main else None)
            if curve_budgets(cfg) and dist.is_main:  # among the settings selected from (a resumed study's later
                release(cfg, finished, selected)     # ones keep theirs): one not selected now never will be
            if not batches:  # the grid is done: one step beyond its edge where the selection sits there
                more = extension(cfg, out, method, dist.from_main(records if dist.is_main else None), selected)
                bar.total += len(more) * (1 + len(evaluations(cfg)))
                mine += more
                batches += [more] if more else []
    bar.close()
    if dist.is_main:
        chosen = select(cfg, records)
        write_report(cfg, out, records, base, chosen, selected_on, time.perf_counter() - start, splits)
        if cfg.commit:
            commit([p for p in out.iterdir() if p.is_file()], f"study {out.name}: the report of {len(records)} runs")
    if curve_budgets(cfg):  # every process trains the curves' runs too, process 0 measures them
        records, chosen = dist.from_main((records, chosen) if dist.is_main else None)
        train_curves(cfg, out, records, chosen, base, prompts, validation, cache, groups)
        if cfg.commit and dist.is_main:
            commit([out / name for name in ("learning_curve.md", "learning_curve.png", "curves.json")],
                   f"study {out.name}: learning curves to {curve_budgets(cfg)[-1]} responses")
    if not dist.is_main:
        return out
    tqdm.write((out / "table1.md").read_text())
    tqdm.write(f"study written to {out} (table1.md, table2.md, runs.md, seed_variance.md, curves.png, pareto, results.json)")
    return out


def main(argv: list[str] | None = None) -> Path:
    return run_main(functools.partial(parse_config, StudyConfig, description=__doc__.split("\n\n")[0]), study, argv)
