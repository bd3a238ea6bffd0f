"""Which reasoning-gym task can the model partly solve? Measure it on many ``rg/<task>-v0`` envs
(task, difficulty config, opening of the assistant's turn) and mark those that give a learning signal.

    python -m benchmarks.study.task_selection                        # the preset: 200 prompts, greedy + 8 samples at T=1
    python -m benchmarks.study.task_selection --pilot true           # the preset's pilot: 32 prompts, greedy + 4 samples
    python -m benchmarks.study.task_selection --engine hf --only chain_sum/answer --limit 20

The entries come from the preset (``--config``, default ``benchmarks/configs/task_selection_cpu.yaml``):
a YAML mapping of options (any flag below, e.g. ``engine: vllm``) and ``entries:``, a list of

    - task: chain_sum                                  # reasoning-gym's task name (rg/chain_sum-v0)
      args: {min_terms: 2, max_terms: 2}               # the task's config fields (and the env's own)
      opening: answer                                  # think (the env's default, "Let me solve this step
                                                       # by step.\\n<think>"), answer ("<answer>"), none,
                                                       # or any other string: that opening
      name: chain_sum-2x1/answer                       # optional; default TASK[-CONFIG]/OPENING

and optionally ``pilot:``, a mapping of options and ``entries`` that ``--pilot true`` measures instead
(flags given on the command line override both).

For each entry, on the first ``--limit`` prompts of the test split and through the eval harness's
own functions (``eval.harness``: the same generation cache, scoring and per-response files as
``python -m eval``), with ONE model and engine for all entries (the engine starts once):

- greedy: pass@1, mean reward, the shares of completions whose answer is a closed
  ``<answer>...</answer>`` block or a final block left open, the share cut at ``--max-new-tokens``;
- ``--samples`` K responses per prompt at ``--temperature`` (default 8 at 1.0): unbiased pass@K and
  the mean reward (and the same shares);
- the extraction check: the env reads the last closed ``<answer>`` block, or, when the turn has
  none, the block it ends in, never closed, to its end (``llm_envs.parsing.final_answer``); how
  many completions end in an open block (at the model's stop
  token / cut at the limit), how many of those score correct, and pass@1, pass@K and the mean
  rewards under the closed-only parser it replaced (``last_tag``, reasoning-gym's ``extract_answer``).

An entry gives a learning SIGNAL when a mean reward (greedy or sampled) is 10-60% of the maximum
(reasoning-gym rewards are in [0, 1]) or pass@K is at least 20%.

Writes OUT/results.json (every measured entry under a key of its task, env arguments and settings;
updated as each entry finishes, so a killed run resumes: finished entries are skipped) and
OUT/table.md (``--pilot``: OUT/pilot.md) with one row per entry. Rewards are recomputed from the
cached generations whenever a record is re-measured (``--rescore true``, or a record written by an
older version of this command). The harness's per-response files go under ``--eval-out`` (default
runs/task-selection/NAME, git-ignored).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eval.harness import EvalConfig, LazyModel
from trainers.common.config import (USER_ERRORS, ConfigError, build_config, check, check_engine, fail, load_yaml,
                                    make_env, make_parser)
from trainers.common.files import atomic_write
from trainers.engines import EngineOptions

#: The preset measured when no ``--config`` is given.
DEFAULT_PRESET = "benchmarks/configs/task_selection_cpu.yaml"
#: Named openings of the assistant's turn (``opening:`` of an entry); any other string is used as is.
OPENINGS: dict[str, bool | str] = {"think": True, "answer": "<answer>", "none": False}
#: The learning-signal criterion: a mean reward in this share of the maximum (1), or pass@K at least PASSK_MIN.
REWARD_BAND = (0.10, 0.60)
PASSK_MIN = 0.20
RESULTS = "results.json"
#: The layout of a result record; records of another version are measured again (from cached generations).
RECORD_VERSION = 2


@dataclass
class SelectionConfig(EngineOptions):
    model: str = field(default="smollm2-135m", metadata={"help": "HF id, local model dir, or smollm2-135m"})
    out: str = field(default="docs/task-selection", metadata={"help": "where table.md / pilot.md and results.json go"})
    eval_out: str = field(default="runs/task-selection", metadata={"help": "the harness's per-response files, one folder per entry"})
    pilot: bool = field(default=False, metadata={"help": "measure the preset's pilot: its 'pilot:' entries and options, written to pilot.md"})
    table: str | None = field(default=None, metadata={"help": "file name of the table under --out; None = table.md (pilot.md with --pilot)"})
    rescore: bool = field(default=False, metadata={"help": "measure finished entries again (their generations are "
                                                           "cached: this re-scores them with the env's current code)"})
    only: str | None = field(default=None, metadata={"help": "comma-separated entry names (or task names) to measure; None = all"})
    limit: int = field(default=200, metadata={"help": "the first K test prompts of each entry"})
    max_new_tokens: int = field(default=256, metadata={"help": "generation budget"})
    samples: int = field(default=8, metadata={"help": "sampled responses per prompt for pass@K and the sampled mean reward (0: greedy only)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the --samples responses"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    batch_size: int = field(default=32, metadata={"help": "sequences per generate() call"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda; None = cuda if available"})
    dtype: str | None = field(default="auto", metadata={"help": "fp32 / bf16 weights; auto = bf16 on CUDA and on a CPU with bf16 matrix units, fp32 elsewhere"})
    cache: str | None = field(default=None, metadata={"help": "generation cache directory or 'off'; None = the harness's default"})
    score_workers: int | None = field(default=None, metadata={"help": "scoring processes (0: in this process); None = the env's"})

    def validate(self) -> None:
        check(self.limit >= 1, "limit", "must be >= 1")
        check(self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        check(self.samples >= 0, "samples", "must be >= 0")
        check(self.samples == 0 or self.temperature > 0, "temperature", "must be > 0 for sampled responses")
        check(self.batch_size >= 1, "batch_size", "must be >= 1")
        check(self.table is None or ("/" not in self.table and self.table.endswith(".md")), "table",
              "a file name ending in .md (it goes under --out)")
        check_engine(self)

    @property
    def table_name(self) -> str:
        return self.table or ("pilot.md" if self.pilot else "table.md")


@dataclass
class Entry:
    """One measured configuration: a task, its env arguments and the opening of the assistant's turn."""

    task: str
    args: dict[str, Any]
    opening: str = "think"
    name: str = ""

    @property
    def env_id(self) -> str:
        return f"rg/{self.task}-v0"

    @property
    def opening_value(self) -> bool | str:
        return OPENINGS.get(self.opening, self.opening)

    @property
    def opening_label(self) -> str:
        return self.opening if self.opening in OPENINGS else json.dumps(self.opening)

    def env_args(self) -> dict[str, Any]:
        """What ``python -m eval --env-args`` would get (the default opening is left out, so the
        generation cache is shared with a plain ``python -m eval`` of the env)."""
        args = dict(self.args)
        if self.opening != "think":
            args["opening"] = self.opening_value
        return json.loads(json.dumps(args))

    @property
    def config_text(self) -> str:
        return ", ".join(f"{k}={json.dumps(v) if not isinstance(v, (int, float)) else v}" for k, v in self.args.items()) or "default"


def parse_entries(raw: Any, where: str) -> list[Entry]:
    """The ``entries:`` list of a preset, checked (one-line ``ConfigError``s naming the entry)."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: 'entries' must be a non-empty list of {{task, args, opening, name}}")
    entries, names = [], set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("task"), str):
            raise ConfigError(f"{where}: entry {i + 1} needs 'task' (a reasoning-gym task name), got {item!r}")
        unknown = set(item) - {"task", "args", "opening", "name"}
        if unknown:
            raise ConfigError(f"{where}: entry {i + 1} ({item['task']}): unknown key(s) {', '.join(sorted(unknown))}; "
                              "known: task, args, opening, name")
        args = item.get("args") or {}
        if not isinstance(args, dict):
            raise ConfigError(f"{where}: entry {i + 1} ({item['task']}): 'args' must be a mapping")
        opening = item.get("opening", "think")
        if opening is False or opening is None:
            opening = "none"
        if not isinstance(opening, str):
            raise ConfigError(f"{where}: entry {i + 1} ({item['task']}): 'opening' must be think, answer, none or a string")
        entry = Entry(task=item["task"], args=dict(args), opening=opening)
        entry.name = str(item.get("name") or _default_name(entry))
        if entry.name in names:
            raise ConfigError(f"{where}: two entries are named {entry.name!r} (give one a 'name')")
        names.add(entry.name)
        entries.append(entry)
    return entries


def _default_name(entry: Entry) -> str:
    opening = entry.opening if entry.opening in OPENINGS else "custom"
    config = "-".join(f"{k}={v}" for k, v in entry.args.items() if isinstance(v, (int, float, str)))
    return f"{entry.task}{'[' + config + ']' if config else ''}/{opening}"


def parse_args(argv: list[str] | None = None) -> tuple[SelectionConfig, list[Entry]]:
    """The options (preset, its pilot section when ``--pilot``, then flags) and the entries to measure."""
    parser = make_parser(SelectionConfig, __doc__.split("\n\n")[0])
    for action in parser._actions:  # the preset is the default --config
        if action.dest == "config":
            action.default, action.help = DEFAULT_PRESET, f"the preset: YAML options and entries (default: {DEFAULT_PRESET})"
    flags = vars(parser.parse_args(argv))
    preset = flags.pop("config")
    try:
        values = load_yaml(preset)
        pilot_section = values.pop("pilot", None)
        raw_entries = values.pop("entries", None)
        pilot = flags.get("pilot", values.get("pilot", False))
        if str(pilot).lower() in ("1", "true", "yes", "on"):
            if not isinstance(pilot_section, dict):
                raise ConfigError(f"--pilot: the preset {preset} has no 'pilot:' section (a mapping of options and entries)")
            pilot_section = {str(k).replace("-", "_"): v for k, v in pilot_section.items()}
            raw_entries = pilot_section.pop("entries", raw_entries)
            values |= pilot_section
        cfg = build_config(SelectionConfig, values | flags)
        entries = parse_entries(raw_entries, f"--config {preset}")
        if cfg.only:
            wanted = {w.strip() for w in cfg.only.split(",") if w.strip()}
            entries = [e for e in entries if e.name in wanted or e.task in wanted]
            missing = wanted - {e.name for e in entries} - {e.task for e in entries}
            if missing:
                raise ConfigError(f"--only: no entry named {', '.join(sorted(missing))}")
        for e in entries:  # a typo in the last entry fails now, not after hours
            make_env(e.env_id, e.env_args() | {"train_size": 0, "test_size": 1}).close()
    except ConfigError as exc:
        parser.error(f"{exc}")
    return cfg, entries


# ----- measuring ------------------------------------------------------------------------------------


def settings_of(cfg: SelectionConfig) -> dict[str, Any]:
    """What besides the entry determines its numbers."""
    return {"model": cfg.model, "limit": cfg.limit, "max_new_tokens": cfg.max_new_tokens, "samples": cfg.samples,
            "temperature": cfg.temperature if cfg.samples else None, "seed": cfg.seed, "batch_size": cfg.batch_size,
            "engine": cfg.engine, "device": cfg.device, "dtype": cfg.dtype}


@functools.lru_cache(maxsize=None)
def env_code() -> str:
    """A hash of the rg env's code (prompt, opening, answer parsing): a record measured under other
    code is measured again (from cached generations when the prompts did not change)."""
    import llm_envs.envs.rg as rg
    import llm_envs.parsing as parsing

    return hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (rg, parsing))).hexdigest()[:12]


def entry_key(entry: Entry, cfg: SelectionConfig) -> str:
    blob = json.dumps({"task": entry.task, "env_args": entry.env_args(), "code": env_code(), **settings_of(cfg)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def unclosed_answer(turn: str) -> bool:
    """Does the assistant's turn end inside an ``<answer>`` block (its last ``<answer>`` not closed)?"""
    start = turn.rfind("<answer>")
    return start >= 0 and turn.find("</answer>", start) < 0


def _shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Shares of completions whose turn (opening + completion) ends its answer in a closed
    ``<answer>`` block, in one left open (ended at the stop token / cut at the limit), and cut."""
    from llm_envs.parsing import last_tag

    n = max(1, len(rows))
    turns = [(r["opening"] + r["completion"], r["finished"]) for r in rows]
    return {"answer_closed": sum(not unclosed_answer(t) and last_tag(t, "answer") is not None for t, _ in turns) / n,
            "answer_open_stop": sum(unclosed_answer(t) and done for t, done in turns) / n,
            "answer_open_cut": sum(unclosed_answer(t) and not done for t, done in turns) / n,
            "cut": sum(not r["finished"] for r in rows) / n,
            "mean_tokens": sum(r["tokens"] for r in rows) / n}


def extraction(rows: list[dict[str, Any]], examples, samples: int, scorer) -> dict[str, Any]:
    """How much reading an unclosed final ``<answer>`` block matters. The env reads the last closed
    ``<answer>`` block of the turn, or, when it has none, the one the turn ends in, never closed, to
    its end (``llm_envs.parsing.final_answer``); the closed-only parser before it (``last_tag``, as
    reasoning-gym's ``extract_answer``) read only closed blocks. Returns the counts of open final
    blocks (at the stop token / cut at the limit), how many of them the env scores correct, and
    pass@1, pass@K and the mean reward under the closed-only parser (those turns re-scored on their
    last closed block, or 0 without one)."""
    import dataclasses

    from eval.passk import pass_at_ks
    from llm_envs.parsing import last_tag

    per_row = [e for e in examples for _ in range(samples)]
    correct = [bool(r["correct"]) for r in rows]
    reward = [float(r["reward"]) for r in rows]
    open_rows = [i for i, r in enumerate(rows) if unclosed_answer(r["opening"] + r["completion"])]
    rescore = []
    for i in open_rows:
        earlier = last_tag(rows[i]["opening"] + rows[i]["completion"], "answer")  # a closed block before the open one
        if earlier is None:
            correct[i], reward[i] = False, 0.0
        else:
            rescore.append((i, earlier))
    if rescore:
        bare = [dataclasses.replace(per_row[i], prompt=per_row[i].prompt[:-1]) if per_row[i].opening else per_row[i]
                for i, _ in rescore]
        for (i, _), s in zip(rescore, scorer.score_batch([f"<answer>{a}</answer>" for _, a in rescore], bare)):
            correct[i], reward[i] = bool(s.correct), float(s.reward)
    passk = pass_at_ks([correct[i:i + samples] for i in range(0, len(rows), samples)])
    stop = [i for i in open_rows if rows[i]["finished"]]
    cut = [i for i in open_rows if not rows[i]["finished"]]
    return {"open_stop": len(stop), "open_stop_correct": sum(bool(rows[i]["correct"]) for i in stop),
            "open_cut": len(cut), "open_cut_correct": sum(bool(rows[i]["correct"]) for i in cut),
            "open_reward": sum(float(rows[i]["reward"]) for i in open_rows),
            "closed_only": {"pass@1": passk.get(1, 0.0), f"pass@{samples}": passk.get(samples, 0.0),
                            "reward_mean": sum(reward) / max(1, len(reward)),
                            "correct": sum(correct)}}


def measure_entry(entry: Entry, cfg: SelectionConfig, model, cache, spec) -> dict[str, Any]:
    """Greedy and sampled responses of one entry through the harness (cached generations, fresh scores)."""
    import llm_envs
    from eval.harness import generate_and_score, summarize_split, summary_header, write_split
    from trainers.common.rollout import eval_examples

    env_args = entry.env_args()
    env = make_env(entry.env_id, env_args)
    scorer = llm_envs.BatchScorer(env, cfg.score_workers)
    out_dir = Path(cfg.eval_out) / re.sub(r"[^\w.=-]+", "_", entry.name)
    record: dict[str, Any] = {"version": RECORD_VERSION, "name": entry.name, "task": entry.task, "env": entry.env_id,
                              "args": entry.args, "opening": entry.opening,
                              "opening_text": env.examples("test")[0].opening, "env_args": env_args,
                              "settings": settings_of(cfg), "env_code": env_code(), "git_head": _git_head(),
                              "system_prompt": env.system_prompt}
    try:
        examples = eval_examples(env, "test", cfg.limit)
        runs = [("greedy", 1, 0.0)] + ([("sampled", cfg.samples, cfg.temperature)] if cfg.samples else [])
        for name, samples, temperature in runs:
            values = dict(env=entry.env_id, model=cfg.model, split="test", out=str(out_dir), samples=samples,
                          temperature=temperature, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens,
                          batch_size=cfg.batch_size, limit=cfg.limit, env_args=json.dumps(env_args), device=cfg.device,
                          dtype=cfg.dtype, cache=cfg.cache, score_workers=cfg.score_workers,
                          **asdict(cfg.engine_options()))
            ecfg = build_config(EvalConfig, values)
            print(f"[{entry.name}] {name}: {len(examples)} prompts x {samples}", file=sys.stderr, flush=True)
            gen, _, cached = generate_and_score(model, scorer, entry.env_id, env_args, examples, ecfg, cache, "test")
            rows = [{k: v for k, v in r.items() if k != "token_ids"} for r in gen["rows"]]
            summary = summary_header(ecfg, spec, entry.env_id, env_args, "test", model, None)
            summary |= summarize_split(rows, gen, ecfg, None)
            summary["cached"] = cached
            write_split(out_dir, ecfg, spec, entry.env_id, "test", rows, summary)
            record[name] = {"pass@1": summary["pass@1"], f"pass@{samples}": summary["pass@k"].get(str(samples), 0.0),
                            "reward_mean": summary["reward_mean"], "reward_std": summary["reward_std"],
                            **_shares(rows), "n": summary["n"], "responses": summary["responses"],
                            "errors": summary["errors"], "tokens": summary["tokens"],
                            "generation_seconds": summary["seconds"], "cached": cached, "file": summary["file"]}
            record[name]["extraction"] = extraction(rows, examples, samples, scorer)
    finally:
        scorer.close()
        env.close()
    return record


def _git_head() -> str | None:
    """The checkout's commit (read only), with "+dirty" when the env's files differ from it."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "llm_envs"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def signal(record: dict[str, Any]) -> list[str]:
    """Why an entry gives a learning signal (empty: it does not)."""
    low, high = REWARD_BAND
    why = []
    rewards = [record[m]["reward_mean"] for m in ("greedy", "sampled") if m in record]
    if any(low <= r <= high for r in rewards):
        why.append("reward")
    k = record["settings"]["samples"]
    if k and record.get("sampled", {}).get(f"pass@{k}", 0.0) >= PASSK_MIN:
        why.append(f"pass@{k}")
    return why


# ----- results and tables ---------------------------------------------------------------------------


def read_results(path: Path) -> dict[str, Any]:
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and isinstance(data.get("records"), dict):
                data.setdefault("invocations", [])
                return data
        except json.JSONDecodeError:
            pass
        raise ConfigError(f"{path}: not a task-selection results file (move it away to start afresh)")
    return {"about": "benchmarks.study.task_selection: rg tasks measured for a learning signal (see table.md)",
            "records": {}, "invocations": []}


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(data, indent=1) + "\n")  # a kill mid-write leaves the previous file whole


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def render_table(cfg: SelectionConfig, entries: list[Entry], records: dict[str, dict[str, Any]],
                 invocation: dict[str, Any]) -> str:
    k = cfg.samples
    title = "Pilot: " if cfg.pilot else ""
    lines = [f"# {title}reasoning-gym tasks for a learning signal ({cfg.model})", "",
             f"{'PILOT (a quick screen, not the final numbers): ' if cfg.pilot else ''}"
             f"the first {cfg.limit} test prompts of each env, {cfg.max_new_tokens} new tokens, engine {cfg.engine}; "
             f"greedy, and {k} samples per prompt at temperature {cfg.temperature:g} (seed {cfg.seed})."
             if k else f"the first {cfg.limit} test prompts, {cfg.max_new_tokens} new tokens, greedy only.",
             f"Written by `python -m benchmarks.study.task_selection{' --pilot true' if cfg.pilot else ''}` on "
             f"{invocation['started'][:10]}; rows measured so far: "
             f"{sum(records.get(entry_key(e, cfg), {}).get('version') == RECORD_VERSION for e in entries)} of {len(entries)}.", "",
             "Openings of the assistant's turn: `think` = the env's default \"Let me solve this step by step.\\n<think>\", "
             "`answer` = \"<answer>\" (answer first), `none` = no opening.", ""]
    head = ["task", "config", "opening", "greedy pass@1 %", "greedy mean reward"]
    if k:
        head += [f"pass@{k} %", "sampled mean reward"]
    head += ["answer tag % (closed / open)", "cut at limit %", "signal"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    opened = []
    for e in entries:
        r = records.get(entry_key(e, cfg))
        if r is None or r.get("version") != RECORD_VERSION:
            lines.append("| " + " | ".join([e.task, e.config_text, e.opening_label, "(not yet)"] + [""] * (len(head) - 4)) + " |")
            continue
        g, s = r["greedy"], r.get("sampled")
        row = [e.task, e.config_text, e.opening_label, _pct(g["pass@1"]), _num(g["reward_mean"])]
        if k:
            row += [_pct(s[f"pass@{k}"]), _num(s["reward_mean"])]
        why = signal(r)
        row += [f"{_pct(g['answer_closed'])} / {_pct(g['answer_open_stop'] + g['answer_open_cut'])}", _pct(g["cut"]),
                ("**yes** (" + ", ".join(why) + ")") if why else ""]
        lines.append("| " + " | ".join(row) + " |")
        if any(x["extraction"]["open_stop"] + x["extraction"]["open_cut"] for x in (g, s) if x):
            opened.append((e, r))
    low, high = REWARD_BAND
    lines += ["", f"**signal**: a mean reward (greedy or sampled; reasoning-gym rewards are in [0, 1]) of "
                  f"{100 * low:.0f}-{100 * high:.0f}% of the maximum" + (f", or pass@{k} >= {100 * PASSK_MIN:.0f}%" if k else "")
              + ". pass@1 is greedy; pass@k is the unbiased estimate from the samples. Rewards are the env's: the task's "
                "own `score_answer` of the last closed `<answer>` block of the turn (opening + completion), or, without one, "
                "of the block the turn ends in, never closed, read to its end (`llm_envs.parsing.final_answer`); 0 "
                "without either. Many "
                "tasks give partial credit (reasoning-gym's default scorer: len(answer)/len(reply) when the reply "
                "contains the answer). answer tag % = greedy completions whose answer is a closed `<answer>...</answer>` "
                "block / a final block left open; cut at limit % = greedy completions that reached the token limit."]
    if opened:
        lines += ["", "## Extraction: what reading an unclosed final `<answer>` block gains", "",
                  "The env reads a final `<answer>` block left open to the turn's end when the turn has no closed "
                  "block (since commit 1be550a; closed blocks first since issue 33); the "
                  "parser before it read closed blocks only (reasoning-gym's `extract_answer`). Per entry with open "
                  "blocks: how many greedy completions end in one at the model's stop token or cut at the token limit "
                  "(in brackets: how many of those the env scores correct), and each number under the closed-only "
                  "parser → under the env's.", ""]
        head2 = ["task", "config", "opening", "greedy open at stop (correct)", "greedy open, cut (correct)",
                 "greedy pass@1 %", "greedy mean reward"]
        if k:
            head2 += ["sampled open (correct)", f"pass@{k} %", "sampled mean reward"]
        lines += ["| " + " | ".join(head2) + " |", "|" + "|".join("---" for _ in head2) + "|"]
        for e, r in opened:
            g, x = r["greedy"], r["greedy"]["extraction"]
            c = x["closed_only"]
            row = [e.task, e.config_text, e.opening_label, f"{x['open_stop']} ({x['open_stop_correct']})",
                   f"{x['open_cut']} ({x['open_cut_correct']})", f"{_pct(c['pass@1'])} → {_pct(g['pass@1'])}",
                   f"{_num(c['reward_mean'])} → {_num(g['reward_mean'])}"]
            if k:
                s, y = r["sampled"], r["sampled"]["extraction"]
                d = y["closed_only"]
                row += [f"{y['open_stop'] + y['open_cut']} of {s['responses']} ({y['open_stop_correct'] + y['open_cut_correct']})",
                        f"{_pct(d[f'pass@{k}'])} → {_pct(s[f'pass@{k}'])}",
                        f"{_num(d['reward_mean'])} → {_num(s['reward_mean'])}"]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def select_tasks(cfg: SelectionConfig, entries: list[Entry]) -> Path:
    """Measure every entry not measured yet with these settings; returns the table's path."""
    from eval.cache import Cache
    from eval.harness import model_spec

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS
    results = read_results(results_path)
    records = results["records"]
    todo = [e for e in entries if cfg.rescore or records.get(entry_key(e, cfg), {}).get("version") != RECORD_VERSION]
    invocation = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "pilot": cfg.pilot, "table": cfg.table_name,
                  **settings_of(cfg), "entries": len(entries), "measured": [], "skipped": len(entries) - len(todo)}
    table = out / cfg.table_name
    for e in entries:
        if e not in todo:
            print(f"[{e.name}] done before (results.json): skipped", file=sys.stderr, flush=True)
    if todo:
        spec = model_spec(build_config(EvalConfig, dict(model=cfg.model, engine=cfg.engine)))
        cache = Cache(None if cfg.cache in (None, "off") else cfg.cache, enabled=cfg.cache != "off")
        model = TimedModel(spec.path, cfg.device, cache, cfg.dtype, cfg.engine_options())
        results["invocations"].append(invocation)
        start = time.perf_counter()
        try:
            for e in todo:
                t0 = time.perf_counter()
                record = measure_entry(e, cfg, model, cache, spec)
                record["seconds"] = time.perf_counter() - t0
                record["created"] = time.strftime("%Y-%m-%dT%H:%M:%S")
                records[entry_key(e, cfg)] = record
                invocation["measured"].append(e.name)
                invocation["engine_start_seconds"] = model.start_seconds
                invocation["wall_seconds"] = time.perf_counter() - start
                write_json(results_path, results)
                table.write_text(render_table(cfg, entries, records, invocation))
                print(_line(record), flush=True)
        finally:
            model.close()
        invocation["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_json(results_path, results)
    table.write_text(render_table(cfg, entries, records, invocation))
    print(f"wrote {table} and {results_path}", file=sys.stderr, flush=True)
    return table


def _line(r: dict[str, Any]) -> str:
    g, s = r["greedy"], r.get("sampled")
    text = (f"[{r['name']}] greedy pass@1 {100 * g['pass@1']:.1f}%  reward {g['reward_mean']:.3f}  "
            f"answer closed {100 * g['answer_closed']:.0f}% open {100 * (g['answer_open_stop'] + g['answer_open_cut']):.0f}%  "
            f"cut {100 * g['cut']:.0f}%")
    if s:
        k = r["settings"]["samples"]
        text += f" | pass@{k} {100 * s[f'pass@{k}']:.1f}%  sampled reward {s['reward_mean']:.3f}"
    why = signal(r)
    return text + (f"  SIGNAL ({', '.join(why)})" if why else "") + f"  [{r['seconds']:.0f} s]"


class TimedModel(LazyModel):
    """The harness's ``LazyModel`` (one model and engine for every entry), timing the engine's start."""

    start_seconds: float | None = None

    def engine(self):
        if self._engine is None:
            t0 = time.perf_counter()
            if self.engine_options.engine == "vllm" and self.device.type == "cpu":
                # let vLLM's OpenMP threads float (unless VLLM_CPU_OMP_THREADS_BIND says otherwise): on
                # this 2-core machine, shared with other jobs, binding them made greedy decoding 3-6x
                # slower (same tokens)
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            super().engine()
            self.start_seconds = time.perf_counter() - t0
            print(f"engine {self.engine_options.engine} started in {self.start_seconds:.1f} s (once for all entries)",
                  file=sys.stderr, flush=True)
        return self._engine


def main(argv: list[str] | None = None) -> Path:
    cfg, entries = parse_args(argv)
    try:
        return select_tasks(cfg, entries)
    except USER_ERRORS as exc:
        fail(str(exc))


if __name__ == "__main__":
    sys.argv[0] = "python -m benchmarks.study.task_selection"
    main()
