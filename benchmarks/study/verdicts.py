"""The paper's four claims as rules over finished studies' ``results.json``: each gives a verdict
("held", "failed", "not shown" or "untested") and the numbers behind it.

The rules are symmetric: "held" and "failed" need the same evidence, one the mirror of the other,
and "not shown" covers the rest.

- **Moved.** A method moved from the base model when its mean test reward beats the base model's
  by more than twice its seed std, and by more than twice the test set's standard error (the larger
  of the base model's and the method's std of reward over test prompts / sqrt(prompts)). A claim
  about learning is *untested* where the methods it compares did not move: the numbers of models
  that did not change say nothing about how the methods learn. Claims 2 and 3 ask less, that both
  methods of a pair *learned* (mean gain over twice the standard error), since a method whose seeds
  spread widely cannot also beat twice its seed std.
- **p** comes from an exact permutation test (every split of the pooled seeds; with 4 seeds each
  the smallest two-sided p is 2/70 = 0.029), significant below ``SIGNIFICANT``.
- **Claim 1** (budget): the best ES method against the best RL method (by mean test reward). Held
  when ES is ahead with p < 0.05, failed when RL is, else not shown ("matches" cannot be shown by
  4 seeds).
- **Claim 2** (seed spread): each ES method against each RL method where both learned, by a
  permutation test on the absolute deviations of the seeds' test rewards from each method's median
  (one outlier seed sits on one side of every split, so it cannot make p small). Held when ES varies
  significantly less in most pairs and significantly more in none; failed the other way round.
- **Claim 3** (hyperparameter sensitivity): only where every method's grid varies its step size
  alone (ES's alpha, RL's lr) over the same factor with the same number of settings, else "not
  shown, grids differ". Then each ES-RL pair (both learned) compares its per-seed ranges over the
  settings by the same permutation test, with the same majority rule as claim 2.
- **Claim 4** (reward hacking): hacked runs (``eval.table.hacked``), then the reward-KL points of
  the selected settings (one dominating the other); untested where no ES method moved.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from eval.passk import mean_std

ES = ("es_full", "es_lowrank", "es_sampled", "es_lora")
SIGNIFICANT = 0.05
#: The hyperparameter each method's step size is (claim 3 compares grids over it).
STEP_SIZE = {"es": "alpha", "rl": "lr"}


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

    def runs_of(self, method: str, setting: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.results["runs"] if r["method"] == method and setting in (None, r["setting"])]

    def test_se(self, method: str) -> float:
        """The test set's standard error of a mean reward: the larger of the base model's and the
        method's (mean over its selected runs) std of reward over test prompts, / sqrt(prompts)."""
        base = self.results["base"]["greedy"]
        stds = [base.get("reward_std") or 0.0]
        runs = self.runs_of(method, self.methods[method]["setting"])
        stds += [float(np.mean([r["greedy"].get("reward_std") or 0.0 for r in runs]))] if runs else []
        return max(stds) / math.sqrt(max(1, base.get("n") or 1))

    def gain(self, method: str) -> float:
        return mean_std(self.rewards(method))[0] - self.base_reward

    def learned(self, method: str) -> bool:
        """Its mean gain over the base model exceeds twice the test set's standard error."""
        return self.gain(method) > 2 * self.test_se(method)

    def moved(self, method: str) -> bool:
        """It learned, and its gain exceeds twice its seed std too."""
        return self.learned(method) and self.gain(method) > 2 * mean_std(self.rewards(method))[1]

    def setting_means(self, method: str) -> dict[str, float]:
        """Mean test reward over seeds of each of the method's settings."""
        by: dict[str, list[float]] = {}
        for r in self.runs_of(method):
            by.setdefault(r["setting"], []).append(r["greedy"]["reward_mean"])
        return {s: mean_std(v)[0] for s, v in by.items()}

    def reward_spread(self, method: str) -> float:
        """Max - min over the method's settings of their mean test reward."""
        means = list(self.setting_means(method).values())
        return max(means) - min(means)

    def seed_ranges(self, method: str) -> list[float]:
        """Per seed, max - min of the test reward over the method's settings (the seeds every
        setting ran)."""
        by: dict[int, list[float]] = {}
        for r in self.runs_of(method):
            by.setdefault(r["seed"], []).append(r["greedy"]["reward_mean"])
        n = len(self.setting_means(method))
        return [max(v) - min(v) for _, v in sorted(by.items()) if len(v) == n]


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


def deviations(values: list[float]) -> list[float]:
    """Absolute deviations from the median: a seed spread that one outlier cannot decide."""
    median = float(np.median(values))
    return [abs(v - median) for v in values]


def _mean(values: list[float]) -> float:
    return mean_std(values)[0]


def _label(study: Study, key: str) -> str:
    return study.methods[key]["label"]


def _best(study: Study, es: bool) -> str:
    keys = [k for k in study.methods if (k in ES) == es]
    return max(keys, key=lambda k: _mean(study.rewards(k)))


def _sides(study: Study) -> tuple[list[str], list[str]]:
    return [k for k in study.methods if k in ES], [k for k in study.methods if k not in ES]


def claim_budget(study: Study) -> tuple[str, str]:
    """ES matches or beats RL at the same budget: the best ES method against the best RL method."""
    es, rl = _best(study, True), _best(study, False)
    (me, se), (mr, sr) = mean_std(study.rewards(es)), mean_std(study.rewards(rl))
    p = permutation_p(study.rewards(es), study.rewards(rl))
    numbers = f"{_label(study, es)} {me:.3f} ± {se:.3f} against {_label(study, rl)} {mr:.3f} ± {sr:.3f} (p = {p:.3f})"
    if not (study.moved(es) or study.moved(rl)):
        return "untested", numbers + "; neither moved from the base model"
    if p < SIGNIFICANT:
        return ("held", numbers) if me > mr else ("failed", numbers)
    return "not shown", numbers + f"; {'ES' if me > mr else 'RL'} ahead within seed noise"


def pairwise(study: Study, values: Callable[[str], list[float]], what: str) -> tuple[str, str]:
    """Each ES method against each RL method where both learned: ``values`` per method (smaller is
    ES's claim), compared by a permutation test. Held when ES's are significantly smaller in most
    pairs and significantly larger in none; failed the other way round; else not shown."""
    es, rl = _sides(study)
    pairs = [(e, r) for e in es for r in rl if study.learned(e) and study.learned(r)]
    if not pairs:
        learned = ", ".join(_label(study, k) for k in study.methods if study.learned(k)) or "none"
        return "untested", f"no ES-RL pair where both learned (mean gain over twice the test set's standard " \
                           f"error; learned: {learned})"
    found, less, more = [], 0, 0
    for e, r in pairs:
        a, b = values(e), values(r)
        p = permutation_p(a, b)
        less += p < SIGNIFICANT and _mean(a) < _mean(b)
        more += p < SIGNIFICANT and _mean(a) > _mean(b)
        found.append(f"{_label(study, e)} {_mean(a):.3f} vs {_label(study, r)} {_mean(b):.3f} (p = {p:.3f})")
    numbers = f"{what}: " + ", ".join(found)
    if less > len(pairs) / 2 and not more:
        return "held", numbers
    if more > len(pairs) / 2 and not less:
        return "failed", numbers
    return "not shown", numbers + f"; ES significantly less in {less} of {len(pairs)} pairs, more in {more}"


def claim_seeds(study: Study) -> tuple[str, str]:
    """ES varies less from seed to seed: mean absolute deviation of the seeds' test reward from
    the method's median, each ES method against each RL method."""
    return pairwise(study, lambda k: deviations(study.rewards(k)), "mean |seed - median| of test reward")


def step_grid(study: Study, method: str) -> tuple[int, float, bool]:
    """(settings, factor spanned by the step size, whether the grid varies the step size alone)."""
    name = STEP_SIZE["es" if method in ES else "rl"]
    points = {r["setting"]: r.get("hparams", {}) for r in study.runs_of(method)}
    steps = sorted({float(hp[name]) for hp in points.values() if name in hp})
    others = {tuple(sorted((k, v) for k, v in hp.items() if k != name)) for hp in points.values()}
    alone = len(steps) == len(points) and len(others) == 1
    return len(points), (steps[-1] / steps[0] if steps and steps[0] > 0 else math.nan), alone


def claim_settings(study: Study) -> tuple[str, str]:
    """ES is less sensitive to its hyperparameters: per-seed range over each method's step-size
    grid, on grids that span the same factor with the same number of settings."""
    grids = {k: step_grid(study, k) for k in study.methods}
    spans = ", ".join(f"{_label(study, k)} {n} x{f:.3g}" + ("" if alone else " (not the step size alone)")
                      for k, (n, f, alone) in grids.items())
    same = len({n for n, _, _ in grids.values()}) == 1 and all(alone for _, _, alone in grids.values()) and \
        all(n >= 2 for n, _, _ in grids.values())
    factors = [f for _, f, _ in grids.values()]
    if not same or not all(math.isclose(f, factors[0], rel_tol=1e-6) for f in factors):
        return "not shown, grids differ", f"step-size grids (settings x factor): {spans}"
    return pairwise(study, study.seed_ranges, f"per-seed range of test reward over {spans}")


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
    es, rl = _sides(study)
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
    if any(dominates(r, e) for e in es for r in rl) and not any(dominates(e, r) for e in es for r in rl):
        return "failed", numbers + " (no run hacked; an RL point dominates an ES point)"
    return "not shown", numbers + " (no run hacked, and no method's point dominates the other side's alone)"


CLAIMS = [("ES matches or beats RL at the same budget (best ES method's mean test reward against the best RL "
           "method's)", claim_budget),
          ("ES varies less from seed to seed (each ES method against each RL method: the seeds' deviation from "
           "the median)", claim_seeds),
          ("ES is less sensitive to its hyperparameters (per-seed range over step-size grids of the same span)",
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
