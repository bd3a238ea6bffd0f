"""Tables from evaluation results: the paper's Table 1 (accuracy per base model and method),
Table 2 (conciseness: reward and KL across seeds, reward hacking flagged) and, for an
environment measured on several splits (MATH-v0's five benchmarks), a split table (columns in the
order of the env's ``eval_splits``), for sampled evaluations a pass@k / pass^k table (at least one
of k responses correct, and all k of them), and, for multi-turn environments, an episode table
(pass@1, pass@k, mean return, turns, tool calls and tool errors per episode).

    python -m eval.table runs/eval/smollm2-135m runs/es-Countdown-v0-* [--format markdown|latex|csv] [--paper]

Arguments are summary files (``*.summary.json`` written by ``python -m eval``) or directories
searched for them; a trainer run without harness results contributes the held-out evaluations
of its own log (see ``eval.load_results``).

A row (a cell of Table 1) averages only like evaluations: records of one model and method that
differ in any setting that changes the result (``SETTINGS``: the env's options, the data, the
number of prompts, the token budget, the decoding, the dtype, device and engine, the
hyperparameters) are never averaged, but shown on rows of their own, each label naming the
settings it differs in; only seeds are averaged.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eval import METHOD_ORDER, load_results, model_name
from eval import paper as paper_data
from eval.passk import mean_std

#: A run hacks the reward when its reward beats the base model's while its correct rate falls
#: below this fraction of the base model's (judged only where the base model was measured too).
HACK_CORRECT_RATIO = 0.5
DASH = "–"
#: What Table 1's cells must share to be compared: (record key, footnote marker, what it is). A
#: cell measured otherwise than most of its table carries the marker, a note says how, and it is
#: never bold.
COMPARABLE = (("n", "†", "number of held-out prompts (n)"), ("max_new_tokens", "‡", "max_new_tokens"),
              ("source", "§", "source"))
#: What a record's numbers depend on besides the model and its training seed: records that differ
#: in one of these are unlike evaluations, never averaged into one row or cell.
SETTINGS = ("env_args", "stop_strings", "data", "n", "max_new_tokens", "samples", "temperature", "top_p", "kl_to",
            "dtype", "device", "engine", "hparams", "source")


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    bold: set[tuple[int, int]] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    text_columns: int = 1  # leading columns of text (left-aligned); the rest are numbers


# ----- selecting records ----------------------------------------------------------------------------


def is_greedy(r: dict[str, Any]) -> bool:
    return r.get("samples", 1) == 1 and not r.get("temperature")


def group_by(records: Iterable[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out


def finals(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Harness results over trainer-log ones; final models over checkpoints (else the latest)."""
    own = [r for r in records if r.get("source") != "log"] or records
    finals = [r for r in own if r.get("iteration") is None]
    if finals:
        return finals
    last = max(r["iteration"] for r in own)
    return [r for r in own if r["iteration"] == last]


def order_methods(methods: Iterable[str]) -> list[str]:
    present = list(dict.fromkeys(methods))
    return [m for m in METHOD_ORDER if m in present] + [m for m in present if m not in METHOD_ORDER]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    return mean_std(values)[1]


def _bold_best(table: Table, row: int, cols: list[int], values: list[float | None], best=max) -> None:
    numbers = [round(v, 1) for v in values if v is not None]
    if len(set(numbers)) >= 2:  # nothing is best when all are equal
        top = best(numbers)
        table.bold |= {(row, c) for c, v in zip(cols, values) if v is not None and round(v, 1) == round(top, 1)}


def _value(record: dict[str, Any], key: str) -> Any:
    """A record's setting, as compared: a missing source is the harness's, missing stop strings are
    none (no env had any before summaries recorded them)."""
    if key == "source":
        return setting(record, key)
    if key == "stop_strings":
        return list(record.get(key) or [])
    return record.get(key)


def record_settings(record: dict[str, Any]) -> tuple[str, ...]:
    """The record's ``SETTINGS``, comparable."""
    return tuple(json.dumps(_value(record, k), sort_keys=True, default=str) for k in SETTINGS)


def _settings_text(record: dict[str, Any], keys: list[str]) -> str:
    """``max_new_tokens=48, env_args={"opening": false}``: the record's values of ``keys``."""
    return ", ".join(f"{k}={json.dumps(_value(record, k), sort_keys=True, default=str)}" for k in keys)


def like_groups(records: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """``records`` (one model and method) split into groups of like evaluations (equal
    ``SETTINGS``), the most numerous first, each with the text of the settings it differs from
    the others in ("" when all are alike)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(record_settings(r), []).append(r)
    if len(groups) == 1:
        return [("", records)]
    keys = [k for i, k in enumerate(SETTINGS) if len({key[i] for key in groups}) > 1]
    ordered = sorted(groups.values(), key=len, reverse=True)
    return [(_settings_text(rs[0], keys), rs) for rs in ordered]


def like_rows(labelled: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Rows of like evaluations: each label's records split by ``like_groups``; a label with
    several groups gets one row each, its label followed by the settings that tell them apart."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for label, records in labelled.items():
        for text, group in like_groups(records):
            rows[f"{label} ({text})" if text else label] = group
    return rows


# ----- Table 1 ---------------------------------------------------------------------------------------


def setting(record: dict[str, Any], key: str) -> Any:
    """How ``record`` was measured, for one of the COMPARABLE keys (None: not recorded)."""
    if key == "source":
        return "trainer log" if record.get("source") == "log" else "eval harness"
    return record.get(key)


def flag_differences(cells: dict[tuple[str, str], list[dict[str, Any]]]) -> tuple[dict[tuple[str, str], str], list[str]]:
    """Markers for the cells (base model, method) -> records of a table that were measured
    differently from most cells (another n, max_new_tokens or source), and the notes saying how."""
    marks = {cell: "" for cell in cells}
    notes = []
    for key, mark, what in COMPARABLE:
        values = {cell: {setting(r, key) for r in rs} for cell, rs in cells.items()}
        counts = Counter(v for vs in values.values() for v in vs)
        if len(counts) < 2:
            continue
        usual = counts.most_common(1)[0][0]  # ties: the first seen
        odd = [cell for cell, vs in values.items() if vs != {usual}]
        for cell in odd:
            marks[cell] += mark
        text = lambda v: "?" if v is None else str(v)  # noqa: E731
        detail = "; ".join(f"{base} {method}: {', '.join(sorted(map(text, values[(base, method)])))}" for base, method in odd)
        notes.append(f"{mark} Measured with another {what} than the other cells ({text(usual)}): {detail}. "
                     f"Not comparable as is, never bold.")
    return marks, notes


def method_table(records: list[dict[str, Any]], paper: bool = False) -> list[Table]:
    """Table 1 per (env, split): rows are base models, columns Original then each method
    present (greedy pass@1 in %, mean over seeds); the best of each row in bold. Cells measured
    on another number of prompts, with another max_new_tokens or from another source (a trainer
    log) than the rest of the table are flagged (see COMPARABLE). An env measured on several
    splits gets the split table instead."""
    tables = []
    greedy = [r for r in records if is_greedy(r)]
    multi = {env for (env,), rs in group_by(greedy, ("env",)).items() if len({r["split"] for r in rs}) > 1}
    for (env, split), group in group_by([r for r in greedy if r["env"] not in multi], ("env", "split")).items():
        measured = {}  # (row, method) -> like records: a cell's unlike records go to rows of their own
        for (base, method), rs in group_by(group, ("base_model", "method")).items():
            for k, (text, like) in enumerate(like_groups(finals(rs))):  # the most numerous stays on the base's row
                measured[(model_name(str(base)) + (f" ({text})" if text and k else ""), method)] = like
        cells = {cell: [100 * r["pass@1"] for r in rs] for cell, rs in measured.items()}
        marks, flag_notes = flag_differences(measured)
        published = paper_data.ACCURACY.get(env, {}) if paper else {}
        methods = order_methods([m for _, m in cells] + [m for row in published.values() for m in row])
        table = Table(f"Table 1: {env} ({split}), accuracy (%), greedy pass@1", ["Base model", *methods])
        bases = list(dict.fromkeys(b for b, _ in cells))
        rows = [(b, {m: _mean(cells[(b, m)]) for m in methods if (b, m) in cells}) for b in bases]
        rows += [(f"{b} (paper)", row) for b, row in published.items()]
        for i, (base, values) in enumerate(rows):
            table.rows.append([base, *(f"{values[m]:.1f}{marks.get((base, m), '')}" if m in values else DASH
                                       for m in methods)])
            _bold_best(table, i, list(range(1, len(methods) + 1)),
                       [None if marks.get((base, m)) else values.get(m) for m in methods])
        table.notes += flag_notes
        if any(r.get("source") == "log" for r in group):
            table.notes.append("Some numbers come from trainer logs (held-out greedy pass@1 measured during training).")
        if any(len(v) > 1 for v in cells.values()):
            table.notes.append("Cells with several runs show their mean.")
        if published:
            table.notes.append("(paper): Qiu et al., Table 1; their Dr.GRPO column is Dr.GRPO-verl.")
        tables.append(table)
    return tables


# ----- the split table (MATH figure) -----------------------------------------------------------------


def split_table(records: list[dict[str, Any]]) -> list[Table]:
    """Per environment measured on two or more splits: rows model + method (+ checkpoint),
    columns the splits and their average (pass@1 in %); the best of each column in bold."""
    tables = []
    for (env,), group in group_by(records, ("env",)).items():
        group = [r for r in group if is_greedy(r)] or group
        splits = list(dict.fromkeys(r["split"] for r in group))
        if len(splits) < 2:
            continue
        declared = _eval_splits(env)
        splits = [s for s in declared if s in splits] + [s for s in splits if s not in declared]
        labelled: dict[str, list[dict[str, Any]]] = {}
        for r in group:
            label = f"{model_name(str(r.get('base_model')))} {r['method']}"
            label += f" (iter {r['iteration']})" if r.get("iteration") is not None else ""
            labelled.setdefault(label, []).append(r)
        cells: dict[str, dict[str, list[float]]] = {}
        for label, rs in like_rows(labelled).items():
            for r in rs:
                cells.setdefault(label, {}).setdefault(r["split"], []).append(100 * r["pass@1"])
        table = Table(f"{env}: pass@1 (%) per split", ["Model", *splits, "Average"])
        columns: list[list[float | None]] = []
        for label, by_split in cells.items():
            values = [_mean(by_split[s]) if s in by_split else None for s in splits]
            average = _mean(values) if None not in values else None
            columns.append(values + [average])
            table.rows.append([label, *(f"{v:.1f}" if v is not None else DASH for v in values + [average])])
        for c in range(len(splits) + 1):
            column = [row[c] for row in columns]
            numbers = [v for v in column if v is not None]
            if len({round(v, 1) for v in numbers}) >= 2:
                table.bold |= {(i, c + 1) for i, v in enumerate(column) if v is not None and round(v, 1) == round(max(numbers), 1)}
        tables.append(table)
    return tables


def _solved_at_turn(records: list[dict[str, Any]]) -> str:
    """"64.0 / 0.0": the % of episodes solved at each turn, a mean over ``records``."""
    if not all("solved_at_turn" in r for r in records):
        return "–"
    turns = max(int(t) for r in records for t in r["solved_at_turn"])
    return " / ".join(f"{100 * _mean([r['solved_at_turn'].get(str(t), 0.0) for r in records]):.1f}"
                      for t in range(1, turns + 1))


def episode_table(records: list[dict[str, Any]]) -> list[Table]:
    """Per multi-turn environment and split (records with ``turns_mean``): rows model + method (+
    checkpoint, + the settings that tell unlike evaluations apart); pass@1 (%), the largest pass@k
    measured (%), mean return, turns, tool calls and tool errors per episode, and the % of episodes
    solved at turn 1, 2, ... (records before it: "–"), each a mean over the records (seeds) of a row."""
    tables = []
    for (env, split), group in group_by([r for r in records if "turns_mean" in r], ("env", "split")).items():
        table = Table(f"{env} ({split}): multi-turn episodes", ["Model", "pass@1 (%)", "pass@k (%)", "Return",
                                                                "Turns", "Tool calls", "Tool errors",
                                                                "Solved at turn 1 / 2 / ... (%)"])
        rows: dict[str, list[dict[str, Any]]] = {}
        for r in group:
            label = f"{model_name(str(r.get('base_model')))} {r['method']}"
            label += f" (iter {r['iteration']})" if r.get("iteration") is not None else ""
            label += "" if is_greedy(r) else f", sampled x{r.get('samples')}"
            rows.setdefault(label, []).append(r)
        for label, rs in like_rows(rows).items():
            k = max(int(x) for r in rs for x in (r.get("pass@k") or {"1": 0}))
            passk = [100 * (r.get("pass@k") or {}).get(str(k), r["pass@1"]) for r in rs]
            table.rows.append([label, f"{_mean([100 * r['pass@1'] for r in rs]):.1f}", f"{_mean(passk):.1f} (k={k})",
                               f"{_mean([r['reward_mean'] for r in rs]):.3f}",
                               *(f"{_mean([r[key] for r in rs]):.2f}"
                                 for key in ("turns_mean", "tool_calls_mean", "tool_errors_mean")),
                               _solved_at_turn(rs)])
        tables.append(table)
    return tables


def _eval_splits(env_id: str) -> tuple[str, ...]:
    """The evaluation splits ``env_id`` declares, in its order (none for an env not registered here)."""
    import llm_envs

    try:
        return llm_envs.registry.env_class(env_id).eval_splits
    except llm_envs.UnknownEnvError:
        return ()


# ----- pass@k and pass^k ------------------------------------------------------------------------------


def sampled_table(records: list[dict[str, Any]]) -> list[Table]:
    """Per (env, split) of sampled results (``--samples`` > 1): rows model + method (+ checkpoint),
    k = the responses per prompt; pass@1, pass@k (one of k correct) and pass^k (all k correct: a
    reliable model's, not a lucky one's) in %, and the mean reward, each a mean over the row's records
    (seeds). Results measured before pass^k was recorded show "–" there."""
    tables = []
    sampled = [r for r in records if r.get("samples", 1) > 1]
    for (env, split), group in group_by(sampled, ("env", "split")).items():
        table = Table(f"{env} ({split}): sampled responses, pass@k and pass^k", ["Model", "k", "pass@1 (%)",
                                                                                "pass@k (%)", "pass^k (%)", "Reward"])
        rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in group:
            label = f"{model_name(str(r.get('base_model')))} {r['method']}"
            label += f" (iter {r['iteration']})" if r.get("iteration") is not None else ""
            rows.setdefault((label, int(r["samples"])), []).append(r)
        for (label, k), rs in rows.items():
            at = [100 * (r.get("pass@k") or {}).get(str(k), r["pass@1"]) for r in rs]
            every = [100 * r["pass^k"][str(k)] for r in rs if str(k) in (r.get("pass^k") or {})]
            table.rows.append([label, str(k), f"{_mean([100 * r['pass@1'] for r in rs]):.1f}", f"{_mean(at):.1f}",
                               f"{_mean(every):.1f}" if len(every) == len(rs) else DASH,
                               f"{_mean([r['reward_mean'] for r in rs]):.3f}"])
        table.notes.append("pass@k: at least one of k responses correct; pass^k: all k correct; both unbiased "
                           "estimates from the k responses per prompt, averaged over prompts, then over a row's runs.")
        tables.append(table)
    return tables


# ----- Table 2 ---------------------------------------------------------------------------------------


def reward_of(r: dict[str, Any]) -> float:
    """The conciseness reward on the paper's [0, 1] scale when the env reports it, else the raw mean."""
    return (r.get("parts_mean") or {}).get("normalized", r["reward_mean"])


def _hparams_text(hparams: dict[str, Any] | None) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in (hparams or {}).items()) or DASH


def hacked(record: dict[str, Any], original: dict[str, Any] | None) -> bool:
    """High reward while ``correct`` collapses: the reward beats the base model's and the correct
    rate falls below HACK_CORRECT_RATIO of the base model's."""
    if record.get("method") == "Original" or original is None:
        return False
    return (reward_of(record) > reward_of(original)
            and record["correct_rate"] < HACK_CORRECT_RATIO * original["correct_rate"])


def _pm(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{_mean(values):.{digits}f} ± {_std(values):.{digits}f}"


def conciseness_table(records: list[dict[str, Any]], paper: bool = False) -> list[Table]:
    """Table 2 per (env, split) of records with a KL measurement: reward and KL, mean ± std across
    seeds, per model, method and hyperparameters; ``*`` marks reward hacking (some seed hacked)."""
    tables = []
    for (env, split), group in group_by([r for r in records if r.get("kl_mean") is not None], ("env", "split")).items():
        normalised = all("normalized" in (r.get("parts_mean") or {}) for r in group)
        table = Table(f"Table 2: {env} ({split}), reward and KL to the base model",
                      ["Model", "Method", "Hyperparameters", "Seeds", "Reward", "KL", "Correct", "Hacked"],
                      text_columns=3)
        originals = {r.get("base_model"): r for r in group if r["method"] == "Original"}
        keyed = group_by([dict(r, _h=_hparams_text(r.get("hparams"))) for r in group], ("base_model", "method", "_h"))
        keys = sorted(keyed, key=lambda k: (str(k[0]), order_methods([k[1] for k in keyed]).index(k[1]), k[2]))
        for base, method, hp in keys:
            runs = finals(keyed[(base, method, hp)])
            flags = [hacked(r, originals.get(base)) for r in runs]
            star = "*" if any(flags) else ""
            table.rows.append([model_name(str(base)), method, hp, str(len(runs)),
                               _pm([reward_of(r) for r in runs]) + star, _pm([r["kl_mean"] for r in runs]) + star,
                               _pm([r["correct_rate"] for r in runs], 2),
                               DASH if method == "Original" else f"{sum(flags)}/{len(runs)}" if base in originals else "?"])
        if paper and env == "Conciseness-v0":
            for method, hp, rm, rs, km, ks, hack in paper_data.CONCISENESS:
                star = "*" if hack else ""
                table.rows.append([f"{paper_data.CONCISENESS_MODEL} (paper)", method, hp, "4", f"{rm:.3f} ± {rs:.3f}{star}",
                                   f"{km:.3f} ± {ks:.3f}{star}", DASH, "yes" if hack else DASH])
            table.notes.append("(paper): Qiu et al., Table 2 (Qwen2.5-7B-Instruct, 4 seeds).")
        table.notes.append(("Reward normalised to [0, 1] (0 = -2000 characters). " if normalised else "")
                           + "± = sample std across seeds (ddof=1); KL = mean per-token k3 KL to the base model on "
                           "sampled responses (both models at the sampling temperature). "
                           f"* = reward hacking: reward above the base model's while the correct rate falls below "
                           f"{HACK_CORRECT_RATIO:g}x the base model's (? = base model not measured).")
        tables.append(table)
    return tables


def build(records: list[dict[str, Any]], which: str = "all", paper: bool = False) -> list[Table]:
    """The tables ``which`` (1, 2, splits, sampled, episodes or all) of ``records``."""
    tables = []
    if which in ("1", "all"):
        tables += method_table(records, paper)
    if which in ("splits", "all"):
        tables += split_table(records)
    if which in ("2", "all"):
        tables += conciseness_table(records, paper)
    if which in ("sampled", "all"):
        tables += sampled_table(records)
    if which in ("episodes", "all"):
        tables += episode_table(records)
    return tables


# ----- rendering -------------------------------------------------------------------------------------


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", DASH: "--", "*": r"$^{*}$",
          "†": r"$^{\dagger}$", "‡": r"$^{\ddagger}$", "§": r"$^{\S}$"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def _markdown(t: Table) -> str:
    cell = lambda i, j, v: f"**{v}**" if (i, j) in t.bold else v  # noqa: E731
    lines = [f"**{t.title}**", "", "| " + " | ".join(t.header) + " |",
             "|" + "|".join(["---"] * t.text_columns + ["---:"] * (len(t.header) - t.text_columns)) + "|"]
    lines += ["| " + " | ".join(cell(i, j, v) for j, v in enumerate(row)) + " |" for i, row in enumerate(t.rows)]
    return "\n".join(lines + ([""] + t.notes if t.notes else []))


def _latex(t: Table) -> str:
    cell = lambda i, j, v: rf"\textbf{{{_latex_escape(v)}}}" if (i, j) in t.bold else _latex_escape(v)  # noqa: E731
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{" + "l" * t.text_columns + "r" * (len(t.header) - t.text_columns) + "}", r"\toprule",
             " & ".join(rf"\textbf{{{_latex_escape(h)}}}" for h in t.header) + r" \\", r"\midrule"]
    lines += [" & ".join(cell(i, j, v) for j, v in enumerate(row)) + r" \\" for i, row in enumerate(t.rows)]
    caption = " ".join([t.title + "."] + t.notes)
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_latex_escape(caption)}}}", r"\end{table}"]
    return "\n".join(lines)


def _csv(t: Table) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    buffer.write(f"# {t.title}\n")
    writer.writerow(t.header)
    writer.writerows([["" if v == DASH else v for v in row] for row in t.rows])
    return buffer.getvalue().rstrip("\n")


def render(tables: list[Table], fmt: str = "markdown") -> str:
    """``tables`` as markdown, LaTeX (booktabs) or CSV text."""
    renderer = {"markdown": _markdown, "latex": _latex, "csv": _csv}[fmt]
    return "\n\n".join(renderer(t) for t in tables) + "\n"


def main(argv: list[str] | None = None) -> str:
    from trainers.common.config import Parser, fail

    parser = Parser(prog="python -m eval.table", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="RUN_OR_RESULT", help="summary files, run dirs or directories of them")
    parser.add_argument("--format", choices=["markdown", "latex", "csv"], default="markdown")
    parser.add_argument("--table", choices=["1", "2", "splits", "sampled", "episodes", "all"], default="all",
                        help="which tables")
    parser.add_argument("--paper", action="store_true", help="add the paper's published numbers beside ours")
    parser.add_argument("--out", help="write the tables to this file too")
    args = parser.parse_args(argv)
    try:
        records = load_results(args.paths)
    except FileNotFoundError as exc:
        fail(str(exc))
    tables = build(records, args.table, args.paper)
    if not tables:
        fail(f"no table to build from {len(records)} result(s) (Table 1 needs greedy results, Table 2 KL results)")
    text = render(tables, args.format)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return text


if __name__ == "__main__":
    main()
