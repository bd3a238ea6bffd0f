"""The README's headline from finished studies: a Table-1-style table (methods x studies, test
pass@1 and reward, mean ± sample std over seeds, the base model's row), each study's wall time,
and the paper's four claims, each with a verdict and the numbers behind it.

    python -m benchmarks.study.headline docs/study-conciseness-4seeds docs/study-rg-arithmetic
    python -m benchmarks.study.headline docs/study-conciseness-4seeds docs/study-rg-arithmetic --readme README.md

``--readme`` rewrites the block between ``<!-- headline:start -->`` and ``<!-- headline:end -->``.

Every verdict is a rule over the studies' ``results.json``, written out in ``benchmarks.study.verdicts``
so a reader can check it: symmetric ("held" and "failed" need the same evidence), with exact
permutation tests over seeds, and "moved" from the base model beyond both the seeds' spread and
the test set's standard error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.study.report import numerics, pm
from benchmarks.study.verdicts import Study, claims
from trainers.common.config import Parser, fail

START, END = "<!-- headline:start -->", "<!-- headline:end -->"


def load(path: Path) -> Study:
    """The study in ``path``; a clear error where it has no finished report."""
    file = path / "results.json"
    if not file.is_file():
        fail(f"{path}: no results.json (is the study finished? `python -m benchmarks.study ... --out {path}`)")
    return Study(path, json.loads(file.read_text()))


def _digits(study: Study) -> int:
    return 1 if abs(study.base_reward) >= 10 else 3


def table(studies: list[Study]) -> str:
    """Methods x studies: test pass@1 (%) and reward, mean ± sample std over seeds, base row first."""
    head = "| Method | " + " | ".join(f"{s.env} pass@1 (%) | {s.env} reward" for s in studies) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(studies)]
    row = ["Base model"]
    for s in studies:
        g = s.results["base"]["greedy"]
        row += [f"{100 * g['pass@1']:.1f}", f"{g['reward_mean']:.{_digits(s)}f}"]
    lines.append("| " + " | ".join(row) + " |")
    keys = list(dict.fromkeys(k for s in studies for k in s.methods))
    for key in keys:
        label = next(s.methods[key]["label"] for s in studies if key in s.methods)
        row = [label]
        for s in studies:
            m = s.methods.get(key)
            row += ["–", "–"] if m is None else [pm(m["test_pass@1"], 1), pm(m["test_reward"], _digits(s))
                                                 + (" *" if s.moved(key) else "")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def study_lines(studies: list[Study]) -> list[str]:
    """One line per study: seeds, budget, selection, numerics (dtype, engine, shared prefix, machine)
    and wall time."""
    out = []
    for s in studies:
        cfg, runs = s.results["config"], s.results["runs"]
        hours = s.results.get("wall_seconds_runs", 0.0) / 3600
        settings = ", ".join(f"{m['label']} {m['setting']}" for m in s.methods.values())
        split = s.results.get("splits", {}).get(s.results["selected_on"])
        size = f" of {split['examples']} examples, {split['prompts']} distinct prompts" if split else ""
        out.append(f"- **{s.env}** (`{s.path}`): {cfg['seeds']} seeds, {len(runs)} runs, {cfg['max_samples']} training "
                   f"responses per run, settings selected on the {s.results['selected_on']!r} split{size} ({settings}); "
                   f"{numerics(s.results['base'], runs)}; **{hours:.1f} h** of training and evaluation.")
    return out


def beats_base(studies: list[Study]) -> list[str]:
    """Each study's methods that beat the base model by more than twice their seed std."""
    out = []
    for s in studies:
        moved = [s.methods[k]["label"] for k in s.methods if s.moved(k)]
        out.append(f"- {s.env}: " + (", ".join(moved) if moved else "none") + " beat the base model's test reward "
                   f"({s.base_reward:.{_digits(s)}f}) by more than twice their seed std and twice the test set's "
                   f"standard error ({max(s.test_se(k) for k in s.methods):.{_digits(s)}f} at most).")
    return out


def headline(studies: list[Study]) -> str:
    """The whole Markdown block."""
    parts = [table(studies), "",
             "Test split, greedy decoding, mean ± sample std (ddof=1) over seeds, each method at the setting "
             "selected without the test split (each study's line below names the split); * = beats the base "
             "model's reward by more than twice its seed std and twice the test set's standard error.", "",
             *study_lines(studies), "", *beats_base(studies), "", "Each study's tables (per setting, every run, "
             "seed variance, reward against KL) are in its directory; the pilots and how the studies were sized: "
             "[docs/study.md](docs/study.md).", "", "**The paper's four claims** (rules: "
             "`benchmarks/study/verdicts.py`; p from an exact permutation test over seeds; held and failed need the "
             "same significance, p < 0.05):", "", *claims(studies), *curve_lines(studies)]
    return "\n".join(parts) + "\n"


def curve_lines(studies: list[Study]) -> list[str]:
    """Each study's learning curves (``--curve-budgets``), where it has them: the figure, claim 1's
    verdict at each budget, whether ES catches up, and whether the first budget repeats the grid."""
    out = []
    for s in studies:
        file = s.path / "curves.json"
        if file.is_file():
            curves = json.loads(file.read_text())
            out += ["", f"**Learning curves, {s.env}** ([learning_curve.md]({s.path}/learning_curve.md)):", "",
                    f"![{s.env}: learning curves]({s.path}/learning_curve.png)", "",
                    *(f"- {line}" for line in curves["verdicts"]),
                    *(f"- {curves[key]}" for key in ("catch_up", "repeats_grid") if curves.get(key))]
    return out


def write_readme(readme: Path, block: str) -> None:
    """Replace the text between the headline markers of ``readme`` with ``block``."""
    text = readme.read_text()
    if START not in text or END not in text:
        fail(f"{readme}: no {START} ... {END} block to rewrite")
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    readme.write_text(pattern.sub(lambda _: f"{START}\n{block}{END}", text, count=1))


def main(argv: list[str] | None = None) -> str:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("studies", nargs="+", help="finished study directories (each holds results.json)")
    parser.add_argument("--readme", default=None, help="rewrite this file's headline block")
    args = parser.parse_args(argv)
    block = headline([load(Path(p)) for p in args.studies])
    if args.readme:
        write_readme(Path(args.readme), block)
    print(block, end="")
    return block


if __name__ == "__main__":
    main()
