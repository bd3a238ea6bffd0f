"""The README's results block from finished studies, and every number behind it for a study page.

    python -m benchmarks.study.headline docs/study-conciseness-r2 docs/study-rg-arithmetic-r2
    python -m benchmarks.study.headline docs/study-conciseness-r2 docs/study-rg-arithmetic-r2 \\
        --readme README.md --details docs/study/round-two.md

The block (printed, and with ``--readme`` written between ``<!-- headline:start -->`` and
``<!-- headline:end -->``) is short: a Table-1-style table (methods x studies, test pass@1 and
reward, mean ± sample std over seeds, the base model's row), then one line per claim with its
verdict, the number it rests on (p, or the hacked runs) and a link, and one line per study with
learning curves. ``--details PAGE`` writes the rest between ``<!-- headline-details:start -->`` and
``<!-- headline-details:end -->`` of that page: each study's seeds, splits, settings, numerics,
machine and wall time, which methods moved, each claim's numbers per study, and the learning
curves' figure, verdicts and notes (which points were retrained on which machine). The README's
claim lines link to that page's sections.

Every verdict is a rule over the studies' ``results.json``, written out in ``benchmarks.study.verdicts``
so a reader can check it: symmetric ("held" and "failed" need the same evidence), with exact
permutation tests over seeds, and "moved" from the base model beyond both the seeds' spread and
the test set's standard error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from benchmarks.study.report import numerics, pm
from benchmarks.study.verdicts import (CLAIMS, QUESTION, SIGNIFICANT, Finding, Study, best, claim_budget,
                                       claim_hacking, claim_near_zero, judge, near_zero, per_machine)
from trainers.common.config import ConfigError, Parser, fail

START, END = "<!-- headline:start -->", "<!-- headline:end -->"
DETAILS_START, DETAILS_END = "<!-- headline-details:start -->", "<!-- headline-details:end -->"
P_VALUE = re.compile(r"\(p = ([0-9.]+)\)")
SPLIT = re.compile(r"ES significantly less in (\d+) of (\d+) pairs, more in (\d+)")
CATCH_UP = re.compile(r"^(.*?\?) .*?: ((?:yes|no|not shown)\b.*?\(p = [0-9.]+\))")


def load(path: Path) -> Study:
    """The study in ``path``; a clear error where it has no finished report."""
    file = path / "results.json"
    if not file.is_file():
        fail(f"{path}: no results.json (is the study finished? `python -m benchmarks.study ... --out {path}`)")
    return Study(path, json.loads(file.read_text()))


def link(target: Path | str, page_dir: Path) -> str:
    """``target`` (a path from the working directory) as a relative link from a page in ``page_dir``."""
    return Path(os.path.relpath(target, page_dir)).as_posix()


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading of plain text: lowercase, punctuation other than hyphens and
    underscores dropped, spaces -> hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _digits(study: Study) -> int:
    return 1 if abs(study.base_reward) >= 10 else 3


def _curves(study: Study) -> dict | None:
    file = study.path / "curves.json"
    return json.loads(file.read_text()) if file.is_file() else None


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


def legend(studies: list[Study], page_dir: Path) -> str:
    """What the table's numbers are, and each study's seeds and budget, linked to its directory."""
    sizes = ", ".join(f"[{s.env}]({link(s.path, page_dir)}/) {s.results['config']['seeds']} x "
                      f"{s.results['config']['max_samples']}" for s in studies)
    return ("Test split, greedy decoding, mean ± sample std (ddof=1) over seeds, each method at the setting selected "
            "without the test split; * = beats the base model's reward by more than twice its seed std and twice the "
            f"test set's standard error over distinct prompts. Seeds x training responses per run: {sizes}.")


def gist(rule, study: Study, found: Finding) -> str:
    """A study's verdict on one claim and the number it rests on: the hacked runs for claim 4, else
    the permutation test's p (claim 1: of the pair it names; claims 2 and 3: how many pairs pass it,
    which way where "not shown", and the range of p); and, where a gate changed the verdict, what it
    would be without it."""
    verdict, numbers = found
    ungated = ""
    if found.ungated and found.ungated != verdict:  # what the gate hid, in the same few words
        ps = P_VALUE.findall(found.ungated_numbers)
        low = sum(float(p) < SIGNIFICANT for p in ps)
        split = directions(found.ungated_numbers, len(ps))
        if split:
            said = f", {split}"
        else:
            said = f", p < {SIGNIFICANT:g} in {low} of {len(ps)} pairs" if len(ps) > 1 else f", p = {ps[0]}" if ps else ""
        ungated = f" (without its gate: {found.ungated}{said})"
    if rule is claim_hacking:
        hacked = sum(m.get("hacked_runs", 0) for m in study.methods.values())
        runs = sum(m.get("runs", 0) for m in study.methods.values())
        return f"{verdict}, {hacked} of {runs} runs hacked{ungated}"
    ps = P_VALUE.findall(numbers)
    if verdict == "untested" or not ps:
        return verdict + ungated
    if rule is claim_budget:
        es, rl = (study.methods[best(study, side)]["label"] for side in (True, False))
        return f"{verdict}, {es} against {rl}, p = {ps[0]}{ungated}"
    significant = sum(float(p) < SIGNIFICANT for p in ps)
    low, high = min(ps, key=float), max(ps, key=float)
    # "not shown" can hide significant pairs on either side: say which way they went
    said = directions(numbers, len(ps)) or f"p < {SIGNIFICANT:g} in {significant} of {len(ps)} pairs"
    return f"{verdict}, {said} (p = {low}-{high}){ungated}"


def directions(numbers: str, compared: int) -> str | None:
    """How many pairs ES was significantly less and more in, summed over every machine ``numbers``
    judges (claims 2 and 3's "not shown"), in the headline's words; None where that does not cover
    all ``compared`` pairs (a machine that held or failed names no direction)."""
    splits = SPLIT.findall(numbers)
    less, pairs, more = (sum(int(split[i]) for split in splits) for i in range(3))
    if not splits or pairs != compared:
        return None
    return f"ES less at p < {SIGNIFICANT:g} in {less} of {pairs} pairs, more in {more}"


def claim_heading(index: int, text: str) -> str:
    return f"Claim {index}: {text.split(' (')[0]}"


def claim_lines(studies: list[Study], details: str | None) -> list[str]:
    """One line per claim: the verdict over the studies, each study's with the number it rests on, and
    a link to the claim's section of the ``details`` page (a link from the README's folder)."""
    out = []
    for i, ((text, verdict, found), (_, rule)) in enumerate(zip(judge(studies), CLAIMS), 1):
        where = f" ([every number]({details}#{anchor(claim_heading(i, text))}))" if details else ""
        per_study = "; ".join(f"{s.env}: {gist(rule, s, f)}" for s, f in found)
        out.append(f"{i}. **{text.split(' (')[0]}: {verdict}.** {per_study}{where}.")
    return out


def question_lines(studies: list[Study]) -> list[str]:
    """Round three's pre-registered question (``verdicts.QUESTION``), for the studies whose base model
    is near zero: each one's verdict, the numbers it rests on and the commit that holds the rule."""
    out = []
    for s in (s for s in studies if near_zero(s)):
        found = per_machine(claim_near_zero)(s)
        commit = s.results["config"].get("rule_commit")
        since = amendments(commit) if commit else []
        rule = (f" (rule pre-registered in commit {commit[:12]}"
                + (f"; `verdicts.py` changed since in {', '.join(since)}" if since else "") + ")"
                if commit else " (no pre-registered rule commit recorded)")
        out.append(f"- **{QUESTION} {found.verdict}.** {s.env}: {found.numbers}{rule}.")
    return out


def amendments(commit: str) -> list[str]:
    """The commits after ``commit`` that changed ``benchmarks/study/verdicts.py``, short ids, oldest
    first, so the question's line says whether the rule it applies is the one pre-registered
    (none where git or the commit is not at hand: a copy without history)."""
    here = Path(__file__).resolve().parent
    found = subprocess.run(["git", "log", "--reverse", "--format=%h", f"{commit}..HEAD", "--", "verdicts.py"],
                           capture_output=True, text=True, cwd=here)
    return found.stdout.split() if found.returncode == 0 else []


def curve_line(study: Study, curves: dict, page_dir: Path) -> str:
    """A study's learning curves in one line: claim 1 at each budget with its p, and whether ES
    catches up, linked to its ``learning_curve.md``."""
    budgets = []
    for line in curves["verdicts"]:
        found, p = re.match(r"Claim 1 at (\d+) responses: ([^.]+)\.", line), P_VALUE.search(line)
        if found:
            at = f"{found.group(1)} responses" if not budgets else found.group(1)
            budgets.append(f"at {at}: {found.group(2)}" + (f", p = {p.group(1)}" if p else ""))
    text = f"- **Learning curves, {study.env}** ([learning_curve.md]({link(study.path, page_dir)}/learning_curve.md)): "
    text += "claim 1 " + "; ".join(budgets) + "."
    caught = CATCH_UP.match(curves.get("catch_up") or "")
    return text + (f" {caught.group(1)} {caught.group(2)}." if caught else "")


def headline(studies: list[Study], details: str | None = None, page_dir: Path = Path(".")) -> str:
    """The README's block: the table, its legend, one line per claim and one per study with learning
    curves. ``details``: the link (from ``page_dir``, the README's folder) to the page holding
    ``details()``'s block."""
    parts = [table(studies), "", legend(studies, page_dir), "",
             "**The paper's four claims** (rules: `benchmarks/study/verdicts.py`; p from an exact permutation test "
             f"over seeds, significant below {SIGNIFICANT:g}):", "", *claim_lines(studies, details)]
    questions = question_lines(studies)
    parts += ["", *questions] if questions else []
    curves = [curve_line(s, c, page_dir) for s in studies if (c := _curves(s))]
    return "\n".join(parts + ([""] + curves if curves else [])) + "\n"


def study_lines(studies: list[Study], page_dir: Path) -> list[str]:
    """One line per study: seeds, budget, selection, numerics (dtype, engine, shared prefix, machine)
    and wall time."""
    out = []
    for s in studies:
        cfg, runs = s.results["config"], s.results["runs"]
        hours = s.results.get("wall_seconds_runs", 0.0) / 3600
        settings = ", ".join(f"{m['label']} {m['setting']}" for m in s.methods.values())
        split = s.results.get("splits", {}).get(s.results["selected_on"])
        size = f" of {split['examples']} examples, {split['prompts']} distinct prompts" if split else ""
        out.append(f"- **{s.env}** ([`{s.path}`]({link(s.path, page_dir)}/)): {cfg['seeds']} seeds, {len(runs)} runs, "
                   f"{cfg['max_samples']} training responses per run, settings selected on the "
                   f"{s.results['selected_on']!r} split{size} ({settings}); {numerics(s.results['base'], runs)}; "
                   f"**{hours:.1f} h** of training and evaluation.")
    return out


def beats_base(studies: list[Study]) -> list[str]:
    """Each study's methods that beat the base model by more than twice their seed std."""
    out = []
    for s in studies:
        moved = [s.methods[k]["label"] for k in s.methods if s.moved(k)]
        learned = [s.methods[k]["label"] for k in s.methods if s.learned(k) and not s.moved(k)]
        out.append(f"- {s.env}: " + (", ".join(moved) if moved else "none") + " beat the base model's test reward "
                   f"({s.base_reward:.{_digits(s)}f}) by more than twice their seed std and twice the test set's "
                   f"standard error over distinct prompts ({max(s.test_se(k) for k in s.methods):.{_digits(s)}f} "
                   f"at most)" + (f"; {', '.join(learned)} beat twice the standard error only (learned)"
                                  if learned else "") + ".")
    return out


def curve_details(study: Study, curves: dict, page_dir: Path) -> list[str]:
    """A study's learning curves in full: the figure, claim 1 at each budget, whether ES catches up,
    and whether the first budget repeats the grid (with the machine each differing point trained on)."""
    where = link(study.path, page_dir)
    return [f"### Learning curves, {study.env}", "",
            f"[learning_curve.md]({where}/learning_curve.md) has the table (and the machines that trained its points).",
            "", f"![{study.env}: learning curves]({where}/learning_curve.png)", "",
            *(f"- {line}" for line in curves["verdicts"]),
            *(f"- {curves[key]}" for key in ("catch_up", "repeats_grid") if curves.get(key))]


def details(studies: list[Study], page_dir: Path) -> str:
    """Every number behind the README's block, for a page in ``page_dir``: each study's line, which
    methods moved, a section per claim (its rule, its verdict, each study's numbers) and the learning
    curves."""
    parts = [*study_lines(studies, page_dir), "", *beats_base(studies), ""]
    for i, (text, verdict, found) in enumerate(judge(studies), 1):
        rule = text.split(" (", 1)[1].rstrip(")") if " (" in text else ""
        parts += [f"### {claim_heading(i, text)}", "",
                  f"Rule: {rule} (`benchmarks/study/verdicts.py`). **Over the studies: {verdict}.**", "",
                  *(line for s, f in found for line in (f"- {s.env}: {f.verdict}. {f.numbers}.",
                                                        *([f"  - Gate, said plainly: {f.gate}."] if f.gate else []))),
                  ""]
    questions = question_lines(studies)
    if questions:
        parts += [f"### {QUESTION}", "", "Rule: `claim_near_zero` in `benchmarks/study/verdicts.py` "
                  "(docs/study/round-three.md).", "", *questions, ""]
    for s in studies:
        if (curves := _curves(s)):
            parts += [*curve_details(s, curves, page_dir), ""]
    return "\n".join(parts).rstrip("\n") + "\n"


def marked(page: Path, start: str = START, end: str = END) -> str:
    """``page``'s text; a clear error where it is missing or lacks the markers ``start`` ... ``end``."""
    if not page.is_file():
        fail(f"{page}: no such file")
    text = page.read_text()
    if start not in text or end not in text:
        fail(f"{page}: no {start} ... {end} block to rewrite")
    return text


def write_block(page: Path, block: str, start: str = START, end: str = END) -> None:
    """Replace the text between the markers ``start`` and ``end`` of ``page`` with ``block``."""
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    page.write_text(pattern.sub(lambda _: f"{start}\n{block}{end}", marked(page, start, end), count=1))


def parser() -> Parser:
    """The command line: study directories, and the README and details page to rewrite."""
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("studies", nargs="+", help="finished study directories (each holds results.json)")
    parser.add_argument("--readme", default=None, help="rewrite this file's headline block")
    parser.add_argument("--details", default=None,
                        help="rewrite this page's headline-details block with every number behind the block; "
                             "the block's claim lines link to it")
    return parser


def main(argv: list[str] | None = None) -> str:
    args = parser().parse_args(argv)
    try:
        return rewrite(args)
    except ConfigError as exc:  # a study without errors over distinct prompts, say
        fail(str(exc))


def render_results(studies: list[Study], readme: Path | None,
                   page: Path | None) -> tuple[str, str | None]:
    """The README's block, its links relative to ``readme``'s folder (the working directory without
    one), and the details page's block where ``page`` is given (None otherwise)."""
    readme_dir = readme.parent if readme is not None else Path(".")
    if page is None:
        return headline(studies, None, readme_dir), None
    return headline(studies, link(page, readme_dir), readme_dir), details(studies, page.parent)


def rewrite(args) -> str:
    """``main``'s work: the block printed, and the README's and the page's blocks rewritten (both
    computed and checked before either is written)."""
    studies = [load(Path(p)) for p in args.studies]
    readme = Path(args.readme) if args.readme else None
    page = Path(args.details) if args.details else None
    if readme is not None:
        marked(readme)
    if page is not None:
        marked(page, DETAILS_START, DETAILS_END)
    block, text = render_results(studies, readme, page)
    if page is not None:
        write_block(page, text, DETAILS_START, DETAILS_END)
    if readme is not None:
        write_block(readme, block)
    print(block, end="")
    return block


if __name__ == "__main__":
    main()
