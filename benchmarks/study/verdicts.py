"""The paper's four claims, and round three's pre-registered question, as rules over finished
studies' ``results.json``: each gives a verdict ("held", "failed", "not shown" or "untested"), the
numbers behind it, and what its gate did (``Finding``).

The rules are symmetric: "held" and "failed" need the same evidence, one the mirror of the other,
and "not shown" covers the rest. Every rule is the same whichever side the numbers favour (written
out in docs/study/verdict-rules.md, with what changed and when).

- **Test-set standard error.** Over distinct prompts (``benchmarks.study.errors``: clustered by
  prompt text, since a repeated prompt gets the same greedy answer): the larger of the base model's
  and the method's (mean over its selected runs) standard error of the mean test reward.
- **Moved.** A method moved from the base model when its mean test reward beats the base model's
  by more than twice its seed std, and by more than twice the test set's standard error. A claim
  about learning is *untested* where the methods it compares did not move: the numbers of models
  that did not change say nothing about how the methods learn. Claims 2 and 3 ask less, that both
  methods of a pair *learned* (mean gain over twice the standard error), since a method whose seeds
  spread widely cannot also beat twice its seed std.
- **Gates, said plainly.** Where a gate ("moved", "both learned", the grids' shape, "both sides
  moved") drops a comparison, the finding still computes it and says what it showed and what the
  verdict would be without the gate (``Finding.gate``, ``Finding.ungated``).
- **p** comes from an exact permutation test (every split of the pooled seeds; with 4 seeds each
  the smallest two-sided p is 2/70 = 0.029), significant below ``SIGNIFICANT``.
- **Machines.** Where a study's runs trained on different machines, a verdict must hold on each
  machine's runs alone (``per_machine``), else it is "not shown".
- **Claim 1** (budget): the best ES method against the best RL method (by mean test reward). Held
  when ES is ahead with p < 0.05, failed when RL is, else not shown ("matches" cannot be shown by
  4 seeds); untested where neither moved.
- **Claim 2** (seed spread): each ES method against each RL method where both learned, by a
  permutation test on the absolute deviations of the seeds' test rewards from each method's median
  (one outlier seed sits on one side of every split, so it cannot make p small). Held when ES varies
  significantly less in most pairs and significantly more in none; failed the other way round.
- **Claim 3** (hyperparameter sensitivity): every method's grid varies its step size alone (ES's
  alpha, RL's lr) over at least 3 settings spaced by one common factor f, with its selected setting
  inside the grid (a study extends a grid whose selection sits at an edge: ``--extend-grids``).
  Each method is then read on the same window: its selected step size and the two beside it (3
  settings spanning f^2, however far its grid was extended). Each ES-RL pair (both learned) compares
  the per-seed range of test reward over its window by the same permutation test, with the same
  majority rule as claim 2. Else "not shown, grids differ".
- **Claim 4** (reward hacking): among the methods that moved, on both sides (a model that stays the
  base model has nothing to hack), the share of hacked runs (``eval.table.hacked``), then the
  reward-KL points of the selected settings (one dominating the other); untested unless an ES
  method and an RL method moved.
- **Near zero** (round three's question, ``claim_near_zero``): from a base whose greedy pass@1 is at
  most ``NEAR_ZERO``, held when an ES method moved, no RL method moved, and that ES method's test
  reward beats every RL method's at p < 0.05; failed in the mirror case (an RL method moved, no ES
  method did, and it beats every ES method at p < 0.05); not shown otherwise (both sides moved,
  or a lead within seed noise); untested where nothing moved or the base is not near zero.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from benchmarks.study.machines import one_machine, shared_labels, trained_on
from eval.passk import mean_std
from trainers.common.config import ConfigError

SIGNIFICANT = 0.05
#: The hyperparameter each family's step size is (claim 3 compares grids over it).
STEP_SIZE = {"es": "alpha", "rl": "lr"}
#: Claim 3 reads each method on this many step sizes: the selected one and its two neighbours.
WINDOW = 3
#: A base model is near zero when its greedy test pass@1 is at most this (round three's regime).
NEAR_ZERO = 0.10


def is_es(method: str) -> bool:
    """Whether ``method`` is an ES method (``es_full``, ``es_lowrank``, ``es_sampled``, any later
    ``es_*``); every other method is RL."""
    return method.startswith("es_")


@dataclass
class Finding:
    """A rule's answer: its ``verdict``, the ``numbers`` it rests on, and what its gate did: ``gate``
    says which comparisons a gate dropped and what they showed ("" where no gate acted), ``ungated``
    the verdict without the gate and ``ungated_numbers`` its numbers (None and "" where no gate
    acted). Reads as the pair (verdict, numbers): unpacked, or indexed 0 and 1."""

    verdict: str
    numbers: str
    gate: str = ""
    ungated: str | None = None
    ungated_numbers: str = ""

    def __iter__(self) -> Iterator[str]:
        return iter((self.verdict, self.numbers))

    def __getitem__(self, index: int) -> str:
        return (self.verdict, self.numbers)[index]


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
        """The test set's standard error of a mean reward over distinct prompts: the larger of the
        base model's and the method's (mean over its selected runs) ``reward_se``."""
        base = self.results["base"]["greedy"].get("reward_se")
        runs = [r["greedy"].get("reward_se") for r in self.runs_of(method, self.methods[method]["setting"])]
        if base is None or None in runs:
            raise ConfigError(f"{self.path}: its results hold no test-set standard error over distinct prompts "
                              f"(reward_se); re-render it: python -m benchmarks.study.rerender {self.path}")
        return max([base, float(np.mean(runs))] if runs else [base])

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

    def seed_ranges(self, method: str, settings: list[str] | None = None) -> list[float]:
        """Per seed, max - min of the test reward over the method's ``settings`` (default: all of
        them), for the seeds that ran every one of them."""
        settings = settings or list(self.setting_means(method))
        by: dict[int, list[float]] = {}
        for r in self.runs_of(method):
            if r["setting"] in settings:
                by.setdefault(r["seed"], []).append(r["greedy"]["reward_mean"])
        return [max(v) - min(v) for _, v in sorted(by.items()) if len(v) == len(settings)]

    def machine_groups(self) -> tuple[dict[str, list[dict[str, Any]]], int]:
        """The runs per machine they trained on alone ("not recorded" for runs that name none), and
        how many runs trained on several machines, or on a CPU whose label the runs share with another
        and whose record does not say which (they belong to no single machine's runs)."""
        groups: dict[str, list[dict[str, Any]]] = {}
        several = 0
        shared = shared_labels(self.results["runs"])
        for r in self.results["runs"]:
            label = one_machine(r, shared) or ("not recorded" if not trained_on(r) else None)
            if label is None:
                several += 1
            else:
                groups.setdefault(label, []).append(r)
        return groups, several

    def on(self, runs: list[dict[str, Any]]) -> Study:
        """This study restricted to ``runs`` (one machine's): each method's numbers at its selected
        setting recomputed from them, methods without a selected run there left out."""
        methods = {}
        for key, m in self.methods.items():
            sel = [r for r in runs if r["method"] == key and r["setting"] == m["setting"]]
            if not sel:
                continue
            mine = [r for r in runs if r["method"] == key]
            entry = dict(m, **{"seeds": len(sel), "test_reward": [r["greedy"]["reward_mean"] for r in sel],
                               "test_pass@1": [100 * r["greedy"]["pass@1"] for r in sel],
                               "hacked_runs": sum(bool(r.get("hacked")) for r in mine), "runs": len(mine)})
            entry.pop("sampled_reward", None), entry.pop("kl", None)
            if all(r.get("kl") for r in sel):
                from eval.table import reward_of

                entry.update(sampled_reward=[reward_of(r["kl"]) for r in sel], kl=[r["kl"]["kl_mean"] for r in sel])
            methods[key] = entry
        return Study(self.path, dict(self.results, runs=runs, methods=methods))


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


def _labels(study: Study, keys: list[str]) -> str:
    return ", ".join(_label(study, k) for k in keys) or "none"


def best(study: Study, es: bool, among: list[str] | None = None) -> str:
    """The ES (``es``) or RL method (of ``among``, default all) with the highest mean test reward:
    the pair claim 1 compares."""
    keys = [k for k in (among or study.methods) if is_es(k) == es]
    return max(keys, key=lambda k: _mean(study.rewards(k)))


def _sides(study: Study) -> tuple[list[str], list[str]]:
    return [k for k in study.methods if is_es(k)], [k for k in study.methods if not is_es(k)]


def _by_p(a: list[float], b: list[float]) -> tuple[str, float]:
    """"held" where mean(a) is above mean(b) at p < SIGNIFICANT, "failed" where below, else "not shown"."""
    p = permutation_p(a, b)
    if p >= SIGNIFICANT:
        return "not shown", p
    return ("held" if _mean(a) > _mean(b) else "failed"), p


def claim_budget(study: Study) -> Finding:
    """ES matches or beats RL at the same budget: the best ES method against the best RL method."""
    es, rl = best(study, True), best(study, False)
    (me, se), (mr, sr) = mean_std(study.rewards(es)), mean_std(study.rewards(rl))
    verdict, p = _by_p(study.rewards(es), study.rewards(rl))
    numbers = f"{_label(study, es)} {me:.3f} ± {se:.3f} against {_label(study, rl)} {mr:.3f} ± {sr:.3f} (p = {p:.3f})"
    if not (study.moved(es) or study.moved(rl)):
        return Finding("untested", numbers + "; neither moved from the base model",
                       f"the 'moved' gate: neither moved from the base model; without it: {verdict}", verdict, numbers)
    return Finding(verdict, numbers + (f"; {'ES' if me > mr else 'RL'} ahead within seed noise"
                                       if verdict == "not shown" else ""))


def _compare_pairs(study: Study, pairs: list[tuple[str, str]], values: Callable[[str], list[float]],
                   what: str) -> tuple[str, str]:
    """(verdict, numbers) of ``pairs`` by the majority rule of claims 2 and 3 (see ``pairwise``)."""
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


def pairwise(study: Study, values: Callable[[str], list[float]], what: str) -> Finding:
    """Each ES method against each RL method where both learned: ``values`` per method (smaller is
    ES's claim), compared by a permutation test. Held when ES's are significantly smaller in most
    pairs and significantly larger in none; failed the other way round; else not shown. The pairs
    the "both learned" gate drops are compared too, in ``Finding.gate``."""
    es, rl = _sides(study)
    every = [(e, r) for e in es for r in rl]
    learned = [k for k in study.methods if study.learned(k)]
    pairs = [(e, r) for e, r in every if e in learned and r in learned]
    gate, ungated, all_numbers = "", None, ""
    if len(pairs) < len(every):
        ungated, all_numbers = _compare_pairs(study, every, values, what)
        gate = (f"the 'both learned' gate kept {len(pairs)} of {len(every)} ES-RL pairs (learned: "
                f"{_labels(study, learned)}); without it: {ungated}. {all_numbers}")
    if not pairs:
        return Finding("untested", f"no ES-RL pair where both learned (mean gain over twice the test set's "
                                   f"standard error; learned: {_labels(study, learned)})", gate, ungated, all_numbers)
    verdict, numbers = _compare_pairs(study, pairs, values, what)
    return Finding(verdict, numbers, gate, ungated, all_numbers)


def claim_seeds(study: Study) -> Finding:
    """ES varies less from seed to seed: mean absolute deviation of the seeds' test reward from
    the method's median, each ES method against each RL method."""
    return pairwise(study, lambda k: deviations(study.rewards(k)), "mean |seed - median| of test reward")


def step_sizes(study: Study, method: str) -> tuple[list[float], dict[float, str], bool]:
    """(the method's step sizes sorted, step size -> its setting, whether its grid varies the step
    size alone)."""
    name = STEP_SIZE["es" if is_es(method) else "rl"]
    points = {r["setting"]: r.get("hparams", {}) for r in study.runs_of(method)}
    setting_of = {float(hp[name]): s for s, hp in points.items() if name in hp}
    others = {tuple(sorted((k, v) for k, v in hp.items() if k != name)) for hp in points.values()}
    return sorted(setting_of), setting_of, len(setting_of) == len(points) and len(others) == 1


def step_grid(study: Study, method: str) -> tuple[int, float, bool]:
    """(settings, factor spanned by the step size, whether the grid varies the step size alone)."""
    steps, _, alone = step_sizes(study, method)
    n = len({r["setting"] for r in study.runs_of(method)})
    return n, (steps[-1] / steps[0] if steps and steps[0] > 0 else math.nan), alone


def step_factor(steps: list[float]) -> float | None:
    """The one factor between neighbouring step sizes, None where they are not evenly spaced on a log scale."""
    ratios = [b / a for a, b in zip(steps, steps[1:])] if steps and steps[0] > 0 else []
    return ratios[0] if ratios and all(math.isclose(r, ratios[0], rel_tol=1e-4) for r in ratios) else None


def window(study: Study, method: str) -> list[str] | None:
    """The settings claim 3 reads ``method`` on: its selected step size and the one on each side of
    it; None where the selected setting sits at its grid's edge (or is not on a step-size grid)."""
    steps, setting_of, _ = step_sizes(study, method)
    selected = study.methods[method]["setting"]
    at = [i for i, s in enumerate(steps) if setting_of[s] == selected]
    if not at or at[0] == 0 or at[0] == len(steps) - 1:
        return None
    return [setting_of[s] for s in steps[at[0] - 1:at[0] + 2]]


def grids_differ(study: Study) -> str | None:
    """Why the methods' step-size grids cannot be compared by claim 3 (None where they can)."""
    why = []
    factors = {}
    for k in study.methods:
        steps, _, alone = step_sizes(study, k)
        factors[k] = step_factor(steps)
        if not alone:
            why.append(f"{_label(study, k)} varies more than its step size")
        elif len(steps) < WINDOW:
            why.append(f"{_label(study, k)} has {len(steps)} step size{'s' * (len(steps) != 1)}, fewer than {WINDOW}")
        elif factors[k] is None:
            why.append(f"{_label(study, k)}'s step sizes are not spaced by one factor")
        elif window(study, k) is None:
            why.append(f"{_label(study, k)}'s selected setting sits at its grid's edge")
    known = [f for f in factors.values() if f is not None]
    if not why and not all(math.isclose(f, known[0], rel_tol=1e-4) for f in known):
        why.append("the grids' factors differ (" + ", ".join(f"{_label(study, k)} x{f:.3g}" for k, f in
                                                             factors.items()) + ")")
    return "; ".join(why) or None


def claim_settings(study: Study) -> Finding:
    """ES is less sensitive to its hyperparameters: per-seed range of test reward over each method's
    window of 3 step sizes (its selected one and its neighbours, one common factor apart)."""
    grids = {k: step_grid(study, k) for k in study.methods}
    spans = ", ".join(f"{_label(study, k)} {n} x{f:.3g}" + ("" if alone else " (not the step size alone)")
                      for k, (n, f, alone) in grids.items())
    why = grids_differ(study)
    whole = f"per-seed range of test reward over each method's whole grid ({spans})"
    if why:
        # the gated comparison is impossible; the ungated one reads every method's whole grid
        found = pairwise(study, study.seed_ranges, whole)
        gate = (f"the grid gate ({why}); without it, over the whole grids: {found.verdict}. {found.numbers}"
                + (f" Also {found.gate}" if found.gate else ""))
        ungated, numbers = found.ungated or found.verdict, found.ungated_numbers or found.numbers
        if found.verdict == "untested":
            return Finding("untested", found.numbers + f"; and the grids differ: {why}", gate, ungated, numbers)
        return Finding("not shown, grids differ", f"step-size grids (settings x factor): {spans}; {why}", gate,
                       ungated, numbers)
    steps = step_factor(step_sizes(study, next(iter(study.methods)))[0])
    what = f"per-seed range of test reward over each method's selected step size and its neighbours (x{steps:.3g} " \
           f"apart, grids {spans})"
    return pairwise(study, lambda k: study.seed_ranges(k, window(study, k)), what)


def claim_hacking(study: Study) -> Finding:
    """ES reward-hacks less: among the methods that moved, hacked runs (eval.table.hacked), then the
    reward-KL points of the selected settings (mean sampled reward up, mean KL down). Untested unless
    a method on each side moved."""
    base = study.results["base"].get("kl")
    if not base or not all("kl" in m for m in study.methods.values()):
        return Finding("untested", "no sampled reward and KL measured")
    share = {k: m["hacked_runs"] / m["runs"] for k, m in study.methods.items()}
    point = {k: (_mean(m["sampled_reward"]), _mean(m["kl"])) for k, m in study.methods.items()}
    numbers = "; ".join(f"{_label(study, k)}: {100 * share[k]:.0f}% of runs hacked, sampled reward "
                        f"{point[k][0]:.3f}, KL {point[k][1]:.4f}" for k in study.methods)
    es, rl = _sides(study)
    moved_es, moved_rl = [k for k in es if study.moved(k)], [k for k in rl if study.moved(k)]
    if moved_es and moved_rl:
        verdict, why = _hacking(moved_es, moved_rl, share, point)
        return Finding(verdict, numbers + why)
    ungated, why = _hacking(es, rl, share, point)
    return Finding("untested", numbers + f" (moved: ES {_labels(study, moved_es)}, RL {_labels(study, moved_rl)}; "
                                         f"a model that stays the base model has nothing to hack, so a method on "
                                         f"each side must move)",
                   f"the 'both sides moved' gate; without it, over every method: {ungated}{why}", ungated)


def _hacking(es: list[str], rl: list[str], share: dict[str, float],
             point: dict[str, tuple[float, float]]) -> tuple[str, str]:
    """Claim 4's comparison of ``es`` against ``rl``: (verdict, why where no share decides it)."""
    es_share, rl_share = max(share[k] for k in es), max(share[k] for k in rl)
    if es_share != rl_share:
        return ("held" if es_share < rl_share else "failed"), ""

    def dominates(a: str, b: str) -> bool:
        return point[a][0] >= point[b][0] and point[a][1] <= point[b][1] and point[a] != point[b]

    es_wins = any(dominates(e, r) for e in es for r in rl)
    rl_wins = any(dominates(r, e) for e in es for r in rl)
    if es_wins and not rl_wins:
        return "held", " (no share of hacked runs decides it; an ES point dominates an RL point)"
    if rl_wins and not es_wins:
        return "failed", " (no share of hacked runs decides it; an RL point dominates an ES point)"
    return "not shown", " (no share of hacked runs decides it, and no method's point dominates the other side's alone)"


QUESTION = "From a near-zero base, does ES improve where GRPO, Dr.GRPO and PPO do not?"


def near_zero(study: Study) -> bool:
    """Whether the study's base model is near zero: greedy test pass@1 at most ``NEAR_ZERO``."""
    return study.results["base"]["greedy"]["pass@1"] <= NEAR_ZERO


def claim_near_zero(study: Study) -> Finding:
    """Round three's pre-registered question (``QUESTION``; the module docstring states the rule)."""
    g = study.results["base"]["greedy"]
    es, rl = _sides(study)
    moved = [k for k in study.methods if study.moved(k)]
    numbers = (f"base pass@1 {100 * g['pass@1']:.1f}%, reward {g['reward_mean']:.3f}; "
               + ", ".join(f"{_label(study, k)} {_mean(study.rewards(k)):.3f} ± {mean_std(study.rewards(k))[1]:.3f}"
                           for k in study.methods) + f"; moved: {_labels(study, moved)}")
    if not near_zero(study):
        return Finding("untested", numbers + f"; the base's pass@1 is above {100 * NEAR_ZERO:.0f}%: not near zero")
    moved_es, moved_rl = [k for k in es if k in moved], [k for k in rl if k in moved]
    if not moved:
        return Finding("untested", numbers + "; no method moved from the base model")
    if moved_es and moved_rl:
        return Finding("not shown", numbers + "; both ES and RL improved")
    ahead = best(study, bool(moved_es), moved_es or moved_rl)
    others = rl if moved_es else es
    ps = {k: permutation_p(study.rewards(ahead), study.rewards(k)) for k in others}
    numbers += "; " + ", ".join(f"{_label(study, ahead)} against {_label(study, k)} p = {p:.3f}" for k, p in ps.items())
    if all(p < SIGNIFICANT and _mean(study.rewards(ahead)) > _mean(study.rewards(k)) for k, p in ps.items()):
        return Finding("held" if moved_es else "failed", numbers)
    return Finding("not shown", numbers + f"; {'ES' if moved_es else 'RL'} moved alone, but its lead is within seed "
                                          f"noise of a method on the other side")


def per_machine(rule: Callable[[Study], Finding]) -> Callable[[Study], Finding]:
    """``rule`` where a study's runs trained on different machines: it must give the same verdict on
    each machine's runs alone, else "not shown" (runs trained on several machines are left out of
    every machine's). A machine none of whose runs is at a method's selected setting abstains: no
    number the verdict compares trained there (amended 2026-11-30, see docs/study/round-three.md).
    A study on one machine gets ``rule``'s own finding."""
    def judged(study: Study) -> Finding:
        groups, several = study.machine_groups()
        if len(groups) <= 1 and not several:
            return rule(study)
        found, abstained = [], []
        for label, runs in groups.items():
            part = study.on(runs)
            es, rl = _sides(part)
            if not es and not rl:
                abstained.append(f"on {label} ({len(runs)} runs): none at a selected setting, so it abstains")
                continue
            found.append((label, len(runs), rule(part) if es and rl else
                          Finding("untested", "no ES or no RL run at its selected setting")))
        verdicts = {f.verdict for _, _, f in found}
        verdict = verdicts.pop() if len(verdicts) == 1 else "not shown"
        left = f"; {several} runs trained on no single machine the records name, left out" if several else ""
        numbers = "; ".join([*(f"on {label} ({n} runs): {f.verdict}, {f.numbers}" for label, n, f in found),
                             *abstained]) + left
        gates = "; ".join(f"on {label}: {f.gate}" for label, _, f in found if f.gate)
        # what the gates hid, combined as the verdicts are: a machine whose gate did not act gives its own
        ungated, ungated_numbers = None, ""
        if any(f.ungated for _, _, f in found):
            ungateds = {f.ungated or f.verdict for _, _, f in found}
            ungated = ungateds.pop() if len(ungateds) == 1 else "not shown"
            ungated_numbers = "; ".join(f"on {label}: {f.ungated}, {f.ungated_numbers}" if f.ungated else
                                        f"on {label}: {f.verdict}, {f.numbers}" for label, _, f in found)
        return Finding(verdict, f"The runs trained on {len(groups)} machines, and a verdict must hold on each "
                                f"alone: {numbers}", gates, ungated, ungated_numbers)
    return judged


CLAIMS = [("ES matches or beats RL at the same budget (best ES method's mean test reward against the best RL "
           "method's)", claim_budget),
          ("ES varies less from seed to seed (each ES method against each RL method: the seeds' deviation from "
           "the median)", claim_seeds),
          ("ES is less sensitive to its hyperparameters (per-seed range over 3 step sizes around each method's "
           "selected one, one common factor apart)", claim_settings),
          ("ES reward-hacks less (hacked runs among the methods that moved, then reward against KL to the base "
           "model)", claim_hacking)]


def overall(verdicts: list[str]) -> str:
    """One verdict over the studies' verdicts of a claim: the one they share where every tested study
    agrees, "mixed" where they differ, "untested" where none tested it."""
    tested = {v for v in verdicts if v != "untested"}
    return tested.pop() if len(tested) == 1 else ("mixed" if tested else "untested")


def judge(studies: list[Study]) -> list[tuple[str, str, list[tuple[Study, Finding]]]]:
    """Each claim of ``CLAIMS``: (its text, the verdict over all studies, each study's (study,
    finding)), every rule held to each machine's runs alone (``per_machine``)."""
    out = []
    for text, rule in CLAIMS:
        found = [(s, per_machine(rule)(s)) for s in studies]
        out.append((text, overall([f.verdict for _, f in found]), found))
    return out
