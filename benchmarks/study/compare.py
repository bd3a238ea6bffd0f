"""Do two studies' runs come out the same? For every run both study directories hold (the same
method, hyperparameters and seed), one row: its test pass@1, validation pass@1 and KL to the base
model in each study, how many of its test completions are the same text (greedy, and sampled at
the KL measurement's temperature), and the machines each trained on. Then one line per method.

    python -m benchmarks.study.compare docs/study-rg-nearzero-r3 docs/study-rg-nearzero-r3-zen5

It reads the committed files only (each run's ``study_record.json`` and ``completions.jsonl.gz``,
the base model's under ``evals/base``), so it works on a fresh clone and on unfinished studies.
A replicate on another machine shows there what the machine changes: ES scores greedy answers, so
its runs repeat where greedy decoding does; RL trains on sampled responses, so its runs draw other
samples (docs/study/round-three.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.study.machines import machines_line
from benchmarks.study.record import COMPLETIONS, read_completions
from benchmarks.study.run import RECORD
from trainers.common.config import ConfigError, Parser, fail
from trainers.common.progress import plural


@dataclass
class Pair:
    """One run as two studies recorded it, and the test completions each kept."""
    a: dict[str, Any]
    b: dict[str, Any]
    same: dict[str, tuple[int, int]]  # evaluation ("greedy", "kl") -> (identical texts, compared)


def load_runs(study: Path) -> dict[Path, tuple[dict[str, Any], Path]]:
    """Every finished run of ``study``, keyed by its place under the study (``runs/METHOD/SETTING/seed=N``:
    the setting is named by ``plan.setting_name``, so a grid extension's 0.040500000000000015 is 0.0405
    in both studies) -> (record, directory)."""
    if not study.is_dir():
        raise ConfigError(f"{study}: no such study directory")
    found = {}
    for path in sorted(study.glob(f"runs/*/*/*/{RECORD}")):
        try:
            found[path.parent.relative_to(study)] = json.loads(path.read_text()), path.parent
        except ValueError as exc:
            raise ConfigError(f"{path}: not a readable run record ({exc})") from exc
    return found


def same_texts(a: Path, b: Path) -> dict[str, tuple[int, int]]:
    """Per evaluation in both files: how many completions (matched by item and sample) are the same
    text, out of those both hold; {} where either file is missing."""
    if not (a.is_file() and b.is_file()):
        return {}
    try:
        rows = [{(r["eval"], r["id"], r.get("sample", 0)): r["completion"] for r in read_completions(p)} for p in (a, b)]
    except (OSError, ValueError, KeyError) as exc:  # a truncated gzip, a bad line, a row without its fields
        raise ConfigError(f"{a} or {b}: not a readable completions file ({type(exc).__name__}: {exc})") from exc
    out: dict[str, tuple[int, int]] = {}
    for key in rows[0].keys() & rows[1].keys():
        same, n = out.get(key[0], (0, 0))
        out[key[0]] = same + (rows[0][key] == rows[1][key]), n + 1
    return out


def pairs(a: Path, b: Path) -> list[Pair]:
    """The runs both studies finished (the same method, setting and seed), in ``a``'s order."""
    runs_a, runs_b = load_runs(a), load_runs(b)
    return [Pair(rec, runs_b[key][0], same_texts(path / COMPLETIONS, runs_b[key][1] / COMPLETIONS))
            for key, (rec, path) in runs_a.items() if key in runs_b]


def _get(record: dict[str, Any], *path: str) -> Any:
    for name in path:
        record = record.get(name) if isinstance(record, dict) else None
    return record


def _both(pair: Pair, *path: str, digits: int = 2) -> str:
    values = [_get(r, *path) for r in (pair.a, pair.b)]
    text = ["-" if v is None else f"{v:.{digits}f}" for v in values]
    return " / ".join(text) if text[0] == text[1] else f"**{text[0]} / {text[1]}**"


def _count(same: dict[str, tuple[int, int]], kind: str) -> str:
    return f"{same[kind][0]} of {same[kind][1]}" if kind in same else "-"


def run_rows(found: list[Pair]) -> list[str]:
    """The per-run rows, markdown; a pair that differs is in bold."""
    out = ["| run | test pass@1 | validation pass@1 | KL to the base | greedy test identical | sampled identical | trained on |",
           "|---|---|---|---|---:|---:|---|"]
    for p in found:
        where = [machines_line(r.get("machines") or []) or "-" for r in (p.a, p.b)]
        out.append(f"| {p.a.get('label', p.a['method'])}, {p.a['setting']}, seed {p.a['seed']} "
                   f"| {_both(p, 'greedy', 'pass@1')} | {_both(p, 'validation', 'eval_pass@1', digits=3)} "
                   f"| {_both(p, 'kl', 'kl_mean', digits=4)} | {_count(p.same, 'greedy')} | {_count(p.same, 'kl')} "
                   f"| {' / '.join(where) if where[0] != where[1] else where[0]} |")
    return out


def repeated(pair: Pair) -> bool:
    """The run came out the same in the greedy sense: every greedy test answer identical, and the
    same validation score (the study selects on it)."""
    n_same, n = pair.same.get("greedy", (0, 0))
    return n > 0 and n_same == n and _get(pair.a, "validation", "eval_pass@1") == _get(pair.b, "validation", "eval_pass@1")


def method_lines(found: list[Pair]) -> list[str]:
    """One line per method: how many of its shared runs repeated."""
    methods: dict[str, list[Pair]] = {}
    for p in found:
        methods.setdefault(p.a.get("label", p.a["method"]), []).append(p)
    return [f"- {label}: {sum(map(repeated, ps))} of {plural(len(ps), 'run')} repeated (every greedy test answer and "
            f"the validation score the same)" for label, ps in methods.items()]


def base_lines(a: Path, b: Path) -> list[str]:
    """The base model's test completions in both studies."""
    out = []
    for kind in ("greedy", "kl"):
        same = same_texts(a / "evals" / "base" / kind / COMPLETIONS, b / "evals" / "base" / kind / COMPLETIONS)
        if kind in same:
            out.append(f"- base model, {kind}: {same[kind][0]} of {same[kind][1]} test completions identical")
    return out


def compare(a: Path, b: Path) -> str:
    """The comparison, as markdown."""
    found = pairs(a, b)
    head = [f"{a} against {b}: {plural(len(found), 'run')} in both", "", *base_lines(a, b), *method_lines(found)]
    return "\n".join([*head, "", *run_rows(found)] if found else head) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("a", help="a study directory (holds runs/)")
    parser.add_argument("b", help="another study directory, of the same study's runs")
    args = parser.parse_args(argv)
    try:
        text = compare(Path(args.a), Path(args.b))
    except ConfigError as exc:
        fail(str(exc))
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
