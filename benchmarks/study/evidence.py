"""The evidence behind a study's numbers, from its committed completions (``completions.jsonl.gz``
beside every run's ``study_record.json`` and the base model's ``evals/base/EVAL/summary.json``).

    python -m benchmarks.study.evidence docs/study-rg-arithmetic                     # the counts docs quote
    python -m benchmarks.study.evidence docs/study-rg-arithmetic --rescore runs/rg-rescored

Counts, per model (base model, every run, every learning-curve point) and measurement (greedy,
sampled): responses,
correct, partial credit (0 < reward < 1), answers left open (the turn's last ``<answer>`` never
closed), no ``<answer>`` block, cut at the token limit, and the mean reward.

``--rescore DIR`` scores every committed completion again with the environment's current code and
writes the study's report (tables, figures, ``results.json``, and the learning curves where the study
has them) under DIR: with unchanged scoring it
gives the study's own tables; after a scoring change, what the change does to them. Settings stay
selected on the validation numbers the runs logged (validation completions are not kept).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.study.config import StudyConfig
from benchmarks.study.curves import write_curves
from benchmarks.study.errors import prompt_groups, read_test_prompts, rows_se, write_test_prompts
from benchmarks.study.record import COMPLETIONS, read_completions, select
from benchmarks.study.report import run_hacked, write_report
from eval.table import Table, render
from trainers.common.config import ConfigError, Parser, fail

#: The numbers of a harness summary that rescoring recomputes (KL and timings stay as measured).
SCORE_KEYS = ("pass@1", "pass@k", "correct_rate", "reward_mean", "reward_std", "parts_mean", "errors")


def answer_left_open(turn: str) -> bool:
    """The turn's last ``<answer>`` is never closed after it."""
    start = turn.rfind("<answer>")
    return start >= 0 and turn.find("</answer>", start) < 0


def counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the docs count in one measurement's responses."""
    turns = [(r.get("opening") or "") + r["completion"] for r in rows]
    return {"responses": len(rows), "correct": sum(bool(r["correct"]) for r in rows),
            "partial_credit": sum(0.0 < r["reward"] < 1.0 for r in rows),
            "answer_left_open": sum(answer_left_open(t) for t in turns),
            "no_answer_block": sum("<answer>" not in t for t in turns),
            "cut_at_limit": sum(r.get("finished") is False for r in rows),
            "reward_mean": sum(r["reward"] for r in rows) / max(1, len(rows))}


def load(study: Path) -> dict[str, Any]:
    file = study / "results.json"
    if not file.is_file():
        raise ConfigError(f"{study}: no results.json (is the study finished?)")
    return json.loads(file.read_text())


def run_dir(study: Path, record: dict[str, Any]) -> Path:
    return study / "runs" / record["method"] / record["setting"] / f"seed={record['seed']}"


def curve_points(study: Path) -> list[dict[str, Any]]:
    """The learning curves' points (``--curve-budgets``; none without)."""
    file = study / "curves.json"
    return json.loads(file.read_text())["points"] if file.is_file() else []


def point_completions(study: Path, point: dict[str, Any]) -> Path:
    """The completions of a learning curve's point: its grid run's, for a first point that is the grid
    run itself."""
    if point.get("grid_run"):
        return run_dir(study, point) / COMPLETIONS
    return study / "curves" / point["method"] / point["setting"] / f"seed={point['seed']}" / \
        f"completions-{point['budget']}.jsonl.gz"


def measurements(study: Path, results: dict[str, Any], points: list[dict[str, Any]] | None = None
                 ) -> list[tuple[str, dict[str, Any] | None, Path]]:
    """(model label, its record or None for the base model, its completions file), every one present:
    the base model, every run, and every point of the learning curves (``points``)."""
    found = [(f"Original ({name})", None, study / "evals" / "base" / name / COMPLETIONS) for name in results["base"]]
    found += [(f"{r['label']} {r['setting']} seed={r['seed']}", r, run_dir(study, r) / COMPLETIONS)
              for r in results["runs"]]
    found += [(f"{p['label']} {p['setting']} seed={p['seed']} at {p['budget']} (curve)", p, point_completions(study, p))
              for p in (curve_points(study) if points is None else points)]
    missing = [str(path) for _, _, path in found if not path.is_file()]
    if missing:
        raise ConfigError(f"{study}: {len(missing)} of {len(found)} completions files are missing (first: "
                          f"{missing[0]}); studies run before completions were kept have none")
    return found


def by_eval(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["eval"], []).append(r)
    return out


def count_table(study: Path) -> Table:
    """The counts of every measurement of the study, one row each."""
    results = load(study)
    table = Table(f"Evidence: {study} (from its completions.jsonl.gz files)",
                  ["Model", "Eval", "responses", "correct", "partial credit", "answer left open", "no <answer>",
                   "cut at limit", "mean reward"], text_columns=2)
    seen = set()
    for label, _, path in measurements(study, results):
        if path in seen:
            continue
        seen.add(path)
        for name, rows in by_eval(read_completions(path)).items():
            c = counts(rows)
            table.rows.append([label.split(" (")[0] if label.startswith("Original") else label, name,
                               *(str(c[k]) for k in ("responses", "correct", "partial_credit", "answer_left_open",
                                                     "no_answer_block", "cut_at_limit")), f"{c['reward_mean']:.4f}"])
    table.notes = ["partial credit: 0 < reward < 1; answer left open: the turn's last <answer> is never closed; "
                   "cut at limit: generation stopped at max_new_tokens."]
    return table


def rescored(summary: dict[str, Any], rows: list[dict[str, Any]], scores,
             groups: dict[str, str] | None = None) -> dict[str, Any]:
    """``summary`` with its score numbers computed again from ``rows`` scored as ``scores`` (and its
    standard error over the distinct prompts ``groups`` names, where given)."""
    from eval.harness import summarize_split

    fresh = [dict(r, reward=s.reward, correct=bool(s.correct), parts=s.parts, error=s.error)
             for r, s in zip(rows, scores)]
    numbers = summarize_split(fresh, {"tokens": 0, "seconds": 0.0}, SimpleNamespace(samples=summary["samples"]),
                              None)
    se = {"reward_se": rows_se(fresh, groups)} if groups is not None else {}
    return {**summary, **{k: numbers[k] for k in SCORE_KEYS}, **se}


def rescore(study: Path, out: Path, workers: int | None = None) -> Path:
    """The study's report under ``out``, every test measurement scored again from its completions."""
    import llm_envs
    from trainers.common.config import env_kwargs, make_env
    from trainers.common.rollout import eval_examples

    results = load(study)
    cfg = StudyConfig(**results["config"])
    cfg.validate()
    env = make_env(cfg.env, env_kwargs(cfg.env_args))
    examples = {e.id: e for e in eval_examples(env, cfg.eval_split, cfg.eval_limit)}
    groups = read_test_prompts(study) or prompt_groups(examples.values())
    scorer = llm_envs.BatchScorer(env, workers)
    base = {k: dict(v) for k, v in results["base"].items()}
    records = [dict(r) for r in results["runs"]]  # rescored in these copies
    points = [dict(p) for p in curve_points(study)]
    try:
        for _, record, path in measurements(study, {**results, "runs": records}, points):
            target = base if record is None else record
            for name, rows in by_eval(read_completions(path)).items():
                unknown = [r["id"] for r in rows if r["id"] not in examples]
                if unknown:
                    raise ConfigError(f"{path}: response to {unknown[0]!r}, which the env's {cfg.eval_split!r} split "
                                      f"does not hold now (did the env's data change?)")
                scores = scorer.score_batch([r["completion"] for r in rows], [examples[r["id"]] for r in rows])
                target[name] = rescored(target[name], rows, scores, groups)
    finally:
        scorer.close()
        env.close()
    for r in records:
        r["hacked"] = run_hacked(r, base.get("kl"))
    out.mkdir(parents=True, exist_ok=True)
    write_report(cfg, out, records, base, select(cfg, records), results["selected_on"],
                 results["wall_seconds_last_invocation"], results.get("splits"))
    write_test_prompts(out, groups, cfg.eval_split, cfg.eval_limit)
    if points:
        write_curves(cfg, out, points, base, records)
    return out


def main(argv: list[str] | None = None) -> str:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("study_dir", help="a finished study's --out (results.json and its completions)")
    parser.add_argument("--rescore", default=None, metavar="DIR",
                        help="score the completions again with the env's current code; write the report under DIR")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    study = Path(args.study_dir)
    try:
        if args.rescore:
            if Path(args.rescore).resolve() == study.resolve():
                raise ConfigError("--rescore: write to another directory than the study's own")
            done = rescore(study, Path(args.rescore))
            text = f"rescored {study} into {done}: table1.md, table2.md, runs.md, seed_variance.md, results.json\n"
        else:
            table = count_table(study)
            text = json.dumps([dict(zip(table.header, row)) for row in table.rows], indent=1) + "\n" if args.json \
                else render([table])
    except (ConfigError, OSError, KeyError) as exc:
        fail(f"{args.study_dir}: {exc}")
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
