"""The README's headline from finished studies: a Table-1-style table (methods x studies, test
pass@1 and reward, mean ± sample std over seeds, the base model's row), each study's wall time,
and the paper's four claims, each with a verdict and the numbers behind it.

    python -m benchmarks.headline docs/study-conciseness-4seeds docs/study-rg-arithmetic
    python -m benchmarks.headline docs/study-conciseness-4seeds docs/study-rg-arithmetic --readme README.md

``--readme`` rewrites the block between ``<!-- headline:start -->`` and ``<!-- headline:end -->``.

Every verdict is a rule over the studies' ``results.json``, written out below so a reader can
check it. A method "moved" when its mean test reward beats the base model's by more than twice its
seed std. Two methods' seeds are compared with an exact permutation test of their mean test reward
(every split of the pooled seeds; with 4 seeds each the smallest two-sided p is 2/70 = 0.029).
A claim about learning is *untested* in a study where no method moved: numbers of models that did
not change from the base model say nothing about how the methods learn.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.study_report import numerics, pm
from eval.passk import mean_std
from eval.table import reward_of
from trainers.common.config import Parser, fail

ES = ("es_full", "es_lowrank", "es_sampled")
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
SIGNIFICANT = 0.05


@dataclass
class Study:
    """One finished study: its directory and its ``results.json``."""

    path: Path
    results: dict[str, Any]

    @property
    def env(self) -> str:
        return self.results["base"]["greedy"]["env"]

    @property
    def methods(self) -> dict[str, dict[str, Any]]:
        return self.results["methods"]

    @property
    def base_reward(self) -> float:
        return self.results["base"]["greedy"]["reward_mean"]

    def rewards(self, method: str) -> list[float]:
        """The method's test rewards over seeds, at its selected setting."""
        return self.methods[method]["test_reward"]

    def moved(self, method: str) -> bool:
        m, s = mean_std(self.rewards(method))
        return m - self.base_reward > 2 * s

    def reward_spread(self, method: str) -> float:
        """Max - min over the method's settings of their mean test reward."""
        by_setting: dict[str, list[float]] = {}
        for r in self.results["runs"]:
            if r["method"] == method:
                by_setting.setdefault(r["setting"], []).append(r["greedy"]["reward_mean"])
        means = [mean_std(v)[0] for v in by_setting.values()]
        return max(means) - min(means)


def load(path: Path) -> Study:
    """The study in ``path``; a clear error where it has no finished report."""
    file = path / "results.json"
    if not file.is_file():
        fail(f"{path}: no results.json (is the study finished? `python -m benchmarks.study ... --out {path}`)")
    return Study(path, json.loads(file.read_text()))


def permutation_p(a: list[float], b: list[float]) -> float:
    """Exact two-sided permutation test of mean(a) - mean(b): the share of the splits of the pooled
    values into groups of len(a) and len(b) whose difference is at least as large."""
    pooled, n = a + b, len(a)
    observed = abs(sum(a) / n - sum(b) / len(b))
    total = sum(pooled)
    hits = count = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        left = sum(pooled[i] for i in idx)
        hits += abs(left / n - (total - left) / len(b)) >= observed - 1e-12
        count += 1
    return hits / count


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
        out.append(f"- **{s.env}** (`{s.path}`): {cfg['seeds']} seeds, {len(runs)} runs, {cfg['max_samples']} training "
                   f"responses per run, settings selected on the {s.results['selected_on']!r} split ({settings}); "
                   f"{numerics(s.results['base'], runs)}; **{hours:.1f} h** of training and evaluation.")
    return out


def _best(study: Study, es: bool) -> str:
    keys = [k for k in study.methods if (k in ES) == es]
    return max(keys, key=lambda k: mean_std(study.rewards(k))[0])


def _mean(values: list[float]) -> float:
    return mean_std(values)[0]


def _label(study: Study, key: str) -> str:
    return study.methods[key]["label"]


def claim_budget(study: Study) -> tuple[str, str]:
    """ES matches or beats RL at the same budget: the best ES method against the best RL method."""
    es, rl = _best(study, True), _best(study, False)
    (me, se), (mr, sr) = mean_std(study.rewards(es)), mean_std(study.rewards(rl))
    p = permutation_p(study.rewards(es), study.rewards(rl))
    numbers = f"{_label(study, es)} {me:.3f} ± {se:.3f} against {_label(study, rl)} {mr:.3f} ± {sr:.3f} (p = {p:.3f})"
    if not (study.moved(es) or study.moved(rl)):
        return "untested", numbers + "; neither moved from the base model"
    if me >= mr:
        return "held", numbers
    if p < SIGNIFICANT:
        return "failed", numbers
    return "not shown", numbers + "; RL ahead within seed noise"


def claim_seeds(study: Study) -> tuple[str, str]:
    """ES varies less from seed to seed: mean seed std of test reward, ES methods against RL methods."""
    es = {k: mean_std(study.rewards(k))[1] for k in study.methods if k in ES}
    rl = {k: mean_std(study.rewards(k))[1] for k in study.methods if k not in ES}
    numbers = ", ".join(f"{_label(study, k)} {v:.3f}" for k, v in {**es, **rl}.items())
    if not any(study.moved(k) for k in es):
        return "untested", f"seed std: {numbers}; no ES method moved (a model that stays the base model varies little)"
    verdict = "held" if _mean(list(es.values())) < _mean(list(rl.values())) else "failed"
    return verdict, f"seed std: {numbers}"


def claim_settings(study: Study) -> tuple[str, str]:
    """ES is less sensitive to its hyperparameters: spread over settings of mean test reward."""
    spread = {k: study.reward_spread(k) for k in study.methods}
    numbers = ", ".join(f"{_label(study, k)} {v:.3f}" for k, v in spread.items())
    if not any(study.moved(k) for k in study.methods):
        return "untested", f"spread over settings: {numbers}; no method moved"
    es = [v for k, v in spread.items() if k in ES]
    rl = [v for k, v in spread.items() if k not in ES]
    return ("held" if _mean(es) < _mean(rl) else "failed"), f"spread over settings: {numbers}"


def claim_hacking(study: Study) -> tuple[str, str]:
    """ES reward-hacks less: hacked runs (eval.table.hacked), then the reward-KL points of the
    selected settings (mean sampled reward up, mean KL down). Untested where no ES method moved."""
    base = study.results["base"].get("kl")
    if not base or not all("kl" in m for m in study.methods.values()):
        return "untested", "no sampled reward and KL measured"
    share = {k: m["hacked_runs"] / m["runs"] for k, m in study.methods.items()}
    point = {k: (_mean(m["sampled_reward"]), _mean(m["kl"])) for k, m in study.methods.items()}
    numbers = "; ".join(f"{_label(study, k)}: {100 * share[k]:.0f}% of runs hacked, sampled reward "
                        f"{point[k][0]:.3f}, KL {point[k][1]:.4f}" for k in study.methods)
    es, rl = [k for k in study.methods if k in ES], [k for k in study.methods if k not in ES]
    if not any(study.moved(k) for k in es):
        return "untested", numbers + " (no ES method moved: a model that stays the base model has nothing to hack)"
    es_share, rl_share = max(share[k] for k in es), max(share[k] for k in rl)
    if es_share < rl_share:
        return "held", numbers
    if es_share > rl_share:
        return "failed", numbers

    def dominates(a: str, b: str) -> bool:
        return point[a][0] >= point[b][0] and point[a][1] <= point[b][1] and point[a] != point[b]

    if any(dominates(e, r) for e in es for r in rl) and not any(dominates(r, e) for e in es for r in rl):
        return "held", numbers + " (no run hacked; an ES point dominates an RL point)"
    if all(any(dominates(r, e) for r in rl) for e in es):
        return "failed", numbers + " (no run hacked; every ES point is dominated by an RL point)"
    return "untested", numbers + " (no run hacked, and neither method's point dominates)"


CLAIMS = [("ES matches or beats RL at the same budget (best ES method's mean test reward against the best RL "
           "method's)", claim_budget),
          ("ES varies less from seed to seed (mean over methods of the test reward's seed std)", claim_seeds),
          ("ES is less sensitive to its hyperparameters (spread over settings of the mean test reward)",
           claim_settings),
          ("ES reward-hacks less (hacked runs, then reward against KL to the base model)", claim_hacking)]


def claims(studies: list[Study]) -> list[str]:
    """The four claims, a verdict per study and one over all of them, as Markdown list items."""
    out = []
    for i, (text, rule) in enumerate(CLAIMS, 1):
        found = [(s, *rule(s)) for s in studies]
        verdicts = {v for _, v, _ in found if v != "untested"}
        overall = verdicts.pop() if len(verdicts) == 1 else ("mixed" if verdicts else "untested")
        out.append(f"{i}. **{text}: {overall}.**")
        out += [f"   - {s.env}: {v}. {numbers}." for s, v, numbers in found]
    return out


def beats_base(studies: list[Study]) -> list[str]:
    """Each study's methods that beat the base model by more than twice their seed std."""
    out = []
    for s in studies:
        moved = [_label(s, k) for k in s.methods if s.moved(k)]
        out.append(f"- {s.env}: " + (", ".join(moved) if moved else "none") + " beat the base model's test reward "
                   f"({s.base_reward:.{_digits(s)}f}) by more than twice their seed std.")
    return out


def headline(studies: list[Study]) -> str:
    """The whole Markdown block."""
    parts = [table(studies), "",
             "Test split, greedy decoding, mean ± sample std (ddof=1) over seeds, each method at the setting "
             "selected without the test split (each study's line below names the split); * = beats the base "
             "model's reward by more than twice its seed std.", "",
             *study_lines(studies), "", *beats_base(studies), "", "Each study's tables (per setting, every run, "
             "seed variance, reward against KL) are in its directory; the pilots and how the studies were sized: "
             "[docs/study.md](docs/study.md).", "", "**The paper's four claims** (rules: "
             "`benchmarks/headline.py`; p from an exact permutation test over seeds):", "", *claims(studies)]
    return "\n".join(parts) + "\n"


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
