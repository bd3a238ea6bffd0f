"""The report of ``benchmarks.study``: per-method summaries over seeds and settings, the tables
(``table1.md``, ``table2.md``, ``runs.md``, ``seed_variance.md``), the figures (``curves.png``,
the reward-KL Pareto plot) and ``results.json``. Tables and figures are built with ``eval.table``
and ``eval.plot``, as every other table of the project."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.study.machines import machine_name, shared_labels
from benchmarks.study.verdicts import Study
from eval import model_name
from eval.passk import mean_std
from eval.plot import plot_pareto, plot_seed_bands
from eval.table import Table, conciseness_table, render, reward_of
from eval.table import hacked as hacking_rule

ORIGINAL = "Original"


def pm(values: list[float], digits: int = 1) -> str:
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def _std(values: list[float]) -> float:
    """The sample std (ddof=1) every table of the study reports."""
    return mean_std(values)[1]


def responses(counts: list[int]) -> str:
    """A method's training responses per run as tables show them: one number, or the range over its runs."""
    return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def numerics(base: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """Where the study's numbers were computed, as its tables say it; a study whose evaluations, or a
    method's trainings, mixed device types or dtypes is refused (``ConfigError``): one table must not
    hold numbers computed differently. Results saved before this was recorded say so."""
    from trainers.common.config import ConfigError

    summaries = [*base.values(), *(r[k] for r in records for k in ("greedy", "kl") if r.get(k))]
    evaluated = {f"{s['device']} {s['dtype']}" for s in summaries if s.get("device")}
    trained: dict[str, set[str]] = {}
    for r in records:
        trained.setdefault(r["label"], set()).update(r.get("runtime") or [])
    mixed = [f"evaluations on {' and '.join(sorted(evaluated))}"] if len(evaluated) > 1 else []
    mixed += [f"{label} trained on {' and '.join(sorted(ts))}" for label, ts in trained.items() if len(ts) > 1]
    devices = {t.split()[0] for t in evaluated.union(*trained.values())}
    if len(devices) > 1 and not mixed:
        mixed.append(f"devices {' and '.join(sorted(devices))}")
    if mixed:
        raise ConfigError(f"the study mixes numerics ({'; '.join(mixed)}), so its tables would compare numbers "
                          f"computed differently: run it again on one device, into another --out")
    kinds = set().union(*trained.values())
    if not evaluated and not kinds:
        return "device and dtype not recorded (results saved before they were)"
    if len(kinds) > 1:  # on CUDA: ES weights in bf16, RL's fp32 masters
        training = ", ".join(f"{label} {t}" for label, ts in trained.items() for t in ts)
    else:
        training = kinds.pop() if kinds else "not recorded"
    text = f"device and dtype: evaluation {evaluated.pop() if evaluated else 'not recorded'}, training {training}"
    return text + engines_note(base, records) + shared_prefix_note(records) + machine_note(base, records)


def shared_prefix_note(records: list[dict[str, Any]]) -> str:
    """Whether the RL runs computed each group's prompt once, when recorded."""
    used = sorted({r["shared_prefix"] for r in records if r.get("shared_prefix")})
    return f"; RL updates with the shared prefix {'/'.join(used)}" if used else ""


def machine_note(base: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The machines the study's times come from (CPU and its bf16 units, GPU), when recorded."""
    summaries = [*base.values(), *(r[k] for r in records for k in ("greedy", "kl") if r.get(k))]
    seen = [s["machine"] for s in summaries if s.get("machine")] + [m for r in records for m in r.get("machines") or []]
    shared = shared_labels([{"machines": seen}])
    machines = list(dict.fromkeys(machine_name(m, shared) for m in seen))
    return f"; machine: {', '.join(machines)}" if machines else ""


def engines_note(base: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """Which engine generated the study's responses (training and evaluation), when recorded."""
    summaries = [*base.values(), *(r[k] for r in records for k in ("greedy", "kl") if r.get(k))]
    evaluated = sorted({s["engine"] for s in summaries if s.get("engine")})
    trained = sorted({e for r in records for e in r.get("engines") or []})
    if not evaluated and not trained:
        return ""
    if evaluated == trained:
        return f"; engine: {', '.join(trained)}"
    return f"; engine: training {', '.join(trained) or 'not recorded'}, evaluation {', '.join(evaluated) or 'not recorded'}"


def run_hacked(record: dict[str, Any], original: dict[str, Any] | None) -> bool | None:
    """Reward hacking (eval.table's rule): the sampled reward beats the base model's while the
    correct rate falls below half the base model's. None without the sampled measurement."""
    if "kl" not in record or original is None:
        return None
    return hacking_rule(record["kl"], original)


def summarize_methods(cfg, records, chosen) -> dict[str, dict[str, Any]]:
    """Per method: test numbers of the selected setting over seeds, and the spread over settings."""
    out = {}
    for method in cfg.method_list:
        runs = [r for r in records if r["method"] == method]
        sel = [r for r in runs if r["setting"] == chosen[method]["setting"]]
        per_setting = {}
        for r in runs:
            per_setting.setdefault(r["setting"], []).append(100 * r["greedy"]["pass@1"])
        means = {s: float(np.mean(v)) for s, v in per_setting.items()}
        entry = {"label": runs[0]["label"], "setting": chosen[method]["setting"], "seeds": len(sel),
                 "test_pass@1": [100 * r["greedy"]["pass@1"] for r in sel],
                 "test_reward": [r["greedy"]["reward_mean"] for r in sel],
                 "final_train_reward": [r["validation"]["curve_reward"][-1] for r in sel if r["validation"]["curve_reward"]],
                 "pass@1_by_setting": means,
                 "pass@1_spread_over_settings": max(means.values()) - min(means.values()),
                 "seed_std_by_setting": {s: _std(v) for s, v in per_setting.items()},
                 "hacked_runs": sum(bool(r.get("hacked")) for r in runs), "runs": len(runs),
                 "training_responses": [r["validation"]["samples"] for r in runs]}
        if cfg.kl_samples:
            entry["sampled_reward"] = [reward_of(r["kl"]) for r in sel]
            entry["kl"] = [r["kl"]["kl_mean"] for r in sel]
        out[method] = entry
    return out


# ----- writing the report ----------------------------------------------------------------------------------


def split_line(splits: dict[str, dict[str, int]] | None) -> str:
    """"; splits: train 293 examples (75 distinct prompts), ..." (empty for a study recorded before)."""
    if not splits:
        return ""
    return "; splits: " + ", ".join(f"{name} {c['examples']} examples ({c['prompts']} distinct prompts)"
                                    for name, c in splits.items())


def write_report(cfg, out: Path, records, base, chosen, selected_on: str, seconds: float,
                 splits: dict[str, dict[str, int]] | None = None, config_record: dict | None = None) -> None:
    """Every output file of a finished study under ``out`` (``splits``: each split's examples and
    distinct prompts, ``study_plan.split_plan``; ``config_record``: the config results.json records,
    default ``cfg``'s fields; a re-rendered study keeps the one it ran with)."""
    methods = summarize_methods(cfg, records, chosen)
    greedy_base = base["greedy"]
    n, mnt, env = greedy_base["n"], greedy_base["max_new_tokens"], greedy_base["env"]
    budgets = ", ".join(f"{m['label']} {responses(m['training_responses'])}" for m in methods.values())
    head = (f"{env}, base model {model_name(cfg.model)}; {cfg.seeds} seed(s); training responses per run (budget "
            f"{cfg.max_samples}): {budgets}; max_new_tokens {mnt}; test split {cfg.eval_split!r} (n={n}); settings "
            f"selected on the {selected_on!r} split by {cfg.metric}{split_line(splits)}; {numerics(base, records)}")

    # studies measured before the errors over distinct prompts (and not re-rendered since) show none
    errors = all("reward_se" in s for s in (greedy_base, *(r["greedy"] for r in records)))
    t1 = Table(f"Table 1: {env} ({cfg.eval_split}), greedy pass@1 (%), mean ± sample std over seeds",
               ["Method", "Selected setting", "pass@1 (%)", "Reward", "Training responses", "Seeds", "Settings",
                "pass@1 spread over settings", *(["Test SE (prompts)", "From the base"] if errors else [])],
               text_columns=2)
    t1.rows.append([ORIGINAL, "–", f"{100 * greedy_base['pass@1']:.1f}", f"{greedy_base['reward_mean']:.3f}",
                    *["–"] * 4, *([f"{greedy_base['reward_se']:.3f}", "–"] if errors else [])])
    judged = Study(out, {"base": base, "methods": methods, "runs": records}) if errors else None
    for method, m in methods.items():
        t1.rows.append([m["label"], m["setting"], pm(m["test_pass@1"]), pm(m["test_reward"], digits=3),
                        responses(m["training_responses"]), str(m["seeds"]), str(len(m["pass@1_by_setting"])),
                        f"{m['pass@1_spread_over_settings']:.1f}",
                        *([f"{judged.test_se(method):.3f}", movement(judged, method)] if judged else [])])
    run_seconds = sum(r.get("wall_seconds", 0.0) for r in records)
    t1.notes = [head + f"; {run_seconds / 60:.0f} min of training and evaluation in all.",
                "± = sample std over seeds (ddof=1). Spread = max - min over the method's settings of their mean "
                "test pass@1: sensitivity to hyperparameters (every setting's numbers are in table2.md and runs.md)."]
    if errors:
        t1.notes.append("Test SE: the test set's standard error of a mean reward over distinct prompts (clustered "
                        "by prompt text, benchmarks.study.errors), the larger of the base model's and the method's. "
                        "From the base: moved = the mean gain beats twice it and twice the seed std; learned = it "
                        "beats twice it only; no = neither (benchmarks.study.verdicts).")
    t1.notes += extension_notes(records, chosen)
    (out / "table1.md").write_text(render([t1]))

    # Table 2 groups by the study's settings (for ES, alpha only where a grid of ratios makes it one)
    if cfg.kl_samples:
        one_ratio = len(cfg.grid("alpha_ratios")) == 1
        kl_records = [dict(base["kl"], hparams={})] + [dict(r["kl"], hparams=_hp(r["hparams"], one_ratio))
                                                       for r in records]
        t2 = conciseness_table(kl_records)
        for t in t2:
            t.notes.insert(0, head + f"; {cfg.kl_samples} sampled response(s) per test prompt at temperature 1.")
        (out / "table2.md").write_text(render(t2))
        plot_pareto(kl_records, out)

    rows = Table(f"Every run ({env})", ["Method", "Setting", "Seed", "training responses", f"val {cfg.metric}",
                                           "test pass@1 (%)", "test reward", "sampled reward", "KL", "hacked", "train s"],
                 text_columns=3)
    for r in records:
        kl = r.get("kl") or {}
        rows.rows.append([r["label"], r["setting"], str(r["seed"]), str(r["validation"]["samples"]),
                          f"{r['validation'][cfg.metric]:.4f}",
                          f"{100 * r['greedy']['pass@1']:.1f}", f"{r['greedy']['reward_mean']:.4f}",
                          f"{reward_of(kl):.4f}" if kl else "–", f"{kl['kl_mean']:.4f}" if kl else "–",
                          {True: "yes", False: "no", None: "–"}[r.get("hacked")], f"{r['validation']['seconds']:.0f}"])
    rows.notes = [head + ".", "hacked: the sampled reward beats the base model's while the correct rate falls below "
                  "half of the base model's (eval.table.hacked)."]
    (out / "runs.md").write_text(render([rows]))

    sv = Table(f"Seed variance ({env}): sample std (ddof=1) over {cfg.seeds} seeds", ["Method", "Selected setting",
               "training responses", "test pass@1 std (points)", "test reward std", "final training reward std",
               "mean pass@1 std over all settings"], text_columns=2)
    sv.notes = [head + "."]
    for m in methods.values():
        sv.rows.append([m["label"], m["setting"], responses(m["training_responses"]), f"{_std(m['test_pass@1']):.2f}",
                        f"{_std(m['test_reward']):.4f}",
                        f"{_std(m['final_train_reward']):.4f}" if m["final_train_reward"] else "–",
                        f"{np.mean(list(m['seed_std_by_setting'].values())):.2f}"])
    (out / "seed_variance.md").write_text(render([sv]))

    bands = {}
    for method in cfg.method_list:
        sel = [r for r in records if r["method"] == method and r["setting"] == chosen[method]["setting"]]
        bands[f"{sel[0]['label']} ({chosen[method]['setting']})"] = [(r["validation"]["curve_samples"],
                                                                    r["validation"]["curve_reward"]) for r in sel]
    plot_seed_bands(bands, out / "curves.png", f"{env}: training reward (mean ± std over {cfg.seeds} seeds)")

    results = {"config": config_record or asdict(cfg), "selected_on": selected_on, "wall_seconds_last_invocation": seconds,
               "wall_seconds_runs": run_seconds, "base": base,
               "selection": chosen, "methods": methods, "runs": records, **({"splits": splits} if splits else {})}
    if any(r.get("extension") for r in records):
        results["extensions"] = extension_notes(records, chosen)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


def movement(study: Study, method: str) -> str:
    """"moved", "learned" or "no": how far the method's mean test reward is from the base model's."""
    return "moved" if study.moved(method) else "learned" if study.learned(method) else "no"


def extension_notes(records: list[dict[str, Any]], chosen: dict[str, dict[str, Any]]) -> list[str]:
    """One line per grid a study extended (``--extend-grids``): the settings added beyond an edge where
    the selected setting sat, and the setting selected in the end."""
    added: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        if r.get("extension"):
            added.setdefault(r["method"], {}).setdefault(r["setting"], r["extension"])
    lines = []
    for method, settings in added.items():
        label = next(r["label"] for r in records if r["method"] == method)
        steps = "; ".join(f"{s} (round {e['round']}: {e['edge']} edge, where {e['selected']} was selected)"
                          for s, e in sorted(settings.items(), key=lambda kv: kv[1]["round"]))
        lines.append(f"Grid extended, {label}: {steps}; selected in the end: {chosen[method]['setting']}.")
    return lines


def _hp(hparams: dict[str, float], one_ratio: bool) -> dict[str, float]:
    """A setting's hyperparameters as Table 2 shows them: without alpha where one ratio makes sigma imply
    it; with it where the study has several ratios (else two settings would share one row)."""
    return {k: v for k, v in hparams.items() if k != "alpha" or not one_ratio}

