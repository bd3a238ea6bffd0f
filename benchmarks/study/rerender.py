"""Re-render a finished study: every table, figure and ``results.json`` of ``benchmarks.study``
written again from the study's saved ``results.json`` (and its learning curves from ``curves.json``),
with the current report code (no run is trained or measured; settings are selected again by
``benchmarks.study.record.select``). A study measured before its test-set errors over distinct
prompts were recorded gets them from its committed completions (``fill_errors``).

    python -m benchmarks.study.rerender docs/study-conciseness
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.study.config import StudyConfig
from benchmarks.study.curves import write_curves
from benchmarks.study.errors import prompt_groups, read_test_prompts, rows_se, write_test_prompts
from benchmarks.study.evidence import by_eval, measurements
from benchmarks.study.record import read_completions, select
from benchmarks.study.report import write_report
from trainers.common.config import ConfigError, Parser, fail


def saved_config(config: dict) -> StudyConfig:
    """The ``StudyConfig`` a results.json recorded; an older study's one ES ratio (``alpha_ratio``)
    is read as the grid that replaced it (``alpha_ratios``)."""
    config = dict(config)
    if "alpha_ratio" in config:
        config["alpha_ratios"] = f"{config.pop('alpha_ratio'):g}"
    return StudyConfig(**config)


def fill_errors(out: Path, cfg: StudyConfig, results: dict[str, Any], points: list[dict[str, Any]]) -> int:
    """Add ``reward_se`` (the standard error over distinct prompts, ``benchmarks.study.errors``) to every
    measurement of the base model, the runs and the curves' ``points`` that lacks it, from the study's
    committed completions and ``evals/test_prompts.json`` (written from the env where the study has
    none); how many were added. A study without completions (measured before they were kept) gets none."""
    base, records = results["base"], results["runs"]
    summaries = [*base.values(), *(e[k] for e in (*records, *points) for k in ("greedy", "kl") if e.get(k))]
    if all("reward_se" in s for s in summaries):
        return 0
    try:
        found = measurements(out, results, points)
    except ConfigError:
        return 0  # no completions to count them from: the tables say nothing of them
    groups = read_test_prompts(out)
    if groups is None:
        from trainers.common.config import env_kwargs, make_env
        from trainers.common.rollout import eval_examples

        env = make_env(cfg.env, env_kwargs(cfg.env_args))
        groups = prompt_groups(eval_examples(env, cfg.eval_split, cfg.eval_limit))
        env.close()
        write_test_prompts(out, groups, cfg.eval_split, cfg.eval_limit)
    added = 0
    for _, record, path in found:
        target = base if record is None else record
        for name, rows in by_eval(read_completions(path)).items():
            if target.get(name) and "reward_se" not in target[name]:
                target[name]["reward_se"] = rows_se(rows, groups)
                added += 1
    return added


def rerender(out: Path) -> None:
    """Write the report of the study in ``out`` again from ``out/results.json``."""
    results = json.loads((out / "results.json").read_text())
    cfg = saved_config(results["config"])
    cfg.validate()
    curves = out / "curves.json"
    points = json.loads(curves.read_text())["points"] if curves.is_file() else []
    fill_errors(out, cfg, results, points)
    records = results["runs"]
    write_report(cfg, out, records, results["base"], select(cfg, records), results["selected_on"],
                 results["wall_seconds_last_invocation"], results.get("splits"),
                 config_record=results["config"])  # what the study ran with, not today's fields and defaults
    if curves.is_file():
        write_curves(cfg, out, points, results["base"], records)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("study_dir", help="the study's --out (it holds results.json)")
    args = parser.parse_args(argv)
    try:
        rerender(Path(args.study_dir))
    except (ConfigError, OSError, KeyError, TypeError) as exc:
        fail(f"{args.study_dir}: cannot re-render ({type(exc).__name__}: {exc})")
    curves = ", learning_curve.md, curves.json" if (Path(args.study_dir) / "curves.json").is_file() else ""
    print(f"re-rendered {args.study_dir}: table1.md, table2.md, runs.md, seed_variance.md, figures, results.json"
          f"{curves}")


if __name__ == "__main__":
    main()
