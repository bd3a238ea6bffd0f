"""Re-render a finished study: every table, figure and ``results.json`` of ``benchmarks.study``
written again from the study's saved ``results.json`` (and its learning curves from ``curves.json``),
with the current report code (no run is trained or measured; settings are selected again by
``benchmarks.study.record.select``).

    python -m benchmarks.study.rerender docs/study-conciseness
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.study.config import StudyConfig
from benchmarks.study.curves import write_curves
from benchmarks.study.record import select
from benchmarks.study.report import write_report
from trainers.common.config import ConfigError, Parser, fail


def saved_config(config: dict) -> StudyConfig:
    """The ``StudyConfig`` a results.json recorded; an older study's one ES ratio (``alpha_ratio``)
    is read as the grid that replaced it (``alpha_ratios``)."""
    config = dict(config)
    if "alpha_ratio" in config:
        config["alpha_ratios"] = f"{config.pop('alpha_ratio'):g}"
    return StudyConfig(**config)


def rerender(out: Path) -> None:
    """Write the report of the study in ``out`` again from ``out/results.json``."""
    results = json.loads((out / "results.json").read_text())
    cfg = saved_config(results["config"])
    cfg.validate()
    records = results["runs"]
    write_report(cfg, out, records, results["base"], select(cfg, records), results["selected_on"],
                 results["wall_seconds_last_invocation"], results.get("splits"),
                 config_record=results["config"])  # what the study ran with, not today's fields and defaults
    curves = out / "curves.json"
    if curves.is_file():
        write_curves(cfg, out, json.loads(curves.read_text())["points"], results["base"], records)


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
