"""Figures (PNG, matplotlib) from trainer runs and evaluation results:

- ``curves-ENV.png``: training reward and held-out accuracy against iterations and against the
  sample budget (generated responses), one line per run, one colour per method;
- ``pareto-ENV-SPLIT.png``: mean reward against mean KL to the base model, every measured model
  (final or checkpoint) a point, and each method's Pareto front (the paper's Figure 2);
- ``plot_seed_bands``: training reward against samples, mean and std band over seeds (``benchmarks.study``);
- ``improvement.png``: greedy pass@1 gain over the base model, per base model and method.

    python -m eval.plot runs/ runs/eval/ --out plots/ [--kind curves|pareto|improvement|all]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from eval import find_runs, infer_method, load_results, model_name, read_log
from eval.passk import mean_std
from eval.table import finals, is_greedy, group_by, order_methods, reward_of

#: The paper's colours: ES blue, GRPO black; the rest from matplotlib's cycle.
COLORS = {"ES": "tab:blue", "ES (full-rank)": "tab:blue", "ES (low-rank)": "tab:cyan", "GRPO": "black",
          "GRPO (8)": "black", "GRPO (30)": "dimgray", "Dr.GRPO": "tab:green", "PPO": "tab:orange", "Original": "tab:gray"}
_CYCLE = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def _color(method: str, seen: dict[str, str]) -> str:
    if method not in seen:
        seen[method] = COLORS.get(method) or _CYCLE[len([m for m in seen if m not in COLORS]) % len(_CYCLE)]
    return seen[method]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _safe(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text)


# ----- training curves -------------------------------------------------------------------------------


def run_curves(run: Path) -> dict[str, Any]:
    """A run's method, env and curves: iterations/samples against reward and held-out accuracy."""
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    log = read_log(run)
    train = [r for r in log if "reward_mean" in r]
    evals = [r for r in log if "eval_pass@1" in r]
    samples_at = {0: 0} | {r["iteration"]: r.get("samples", 0) for r in train}
    return {"method": infer_method(config, run.name), "env": config.get("env", "?"), "name": run.name,
            "train_it": [r["iteration"] for r in train], "train_samples": [r.get("samples", 0) for r in train],
            "reward": [r["reward_mean"] for r in train],
            "eval_it": [r["iteration"] for r in evals], "eval_samples": [samples_at.get(r["iteration"]) for r in evals],
            "accuracy": [100 * r["eval_pass@1"] for r in evals]}


def plot_curves(runs: list[Path], out: Path) -> list[Path]:
    """One figure per environment: 2 x 2 panels (reward / held-out accuracy x iterations / samples)."""
    plt = _pyplot()
    curves = [c for c in (run_curves(r) for r in runs) if c["train_it"] or c["eval_it"]]
    files = []
    for env in dict.fromkeys(c["env"] for c in curves):
        fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey="row")
        colors: dict[str, str] = {}
        labelled: set[str] = set()
        for c in sorted((c for c in curves if c["env"] == env), key=lambda c: order_methods([c["method"]])[0]):
            color = _color(c["method"], colors)
            label = None if c["method"] in labelled else c["method"]
            labelled.add(c["method"])
            axes[0, 0].plot(c["train_it"], c["reward"], color=color, label=label, alpha=0.85)
            axes[0, 1].plot(c["train_samples"], c["reward"], color=color, alpha=0.85)
            pts = [(i, s, a) for i, s, a in zip(c["eval_it"], c["eval_samples"], c["accuracy"])]
            axes[1, 0].plot([p[0] for p in pts], [p[2] for p in pts], "o-", color=color, ms=3, alpha=0.85)
            with_samples = [p for p in pts if p[1] is not None]
            axes[1, 1].plot([p[1] for p in with_samples], [p[2] for p in with_samples], "o-", color=color, ms=3, alpha=0.85)
        axes[0, 0].set_ylabel("training reward (mean over population/batch)")
        axes[1, 0].set_ylabel("held-out accuracy (%, greedy pass@1)")
        axes[1, 0].set_xlabel("iteration")
        axes[1, 1].set_xlabel("samples (generated responses)")
        for ax in axes.flat:
            ax.grid(alpha=0.3)
        axes[0, 0].legend(title="method")
        fig.suptitle(f"{env}: training curves")
        fig.tight_layout()
        files.append(_save(fig, out / f"curves-{_safe(env)}.png"))
    return files


def plot_seed_bands(curves: dict[str, list[tuple[list[float], list[float]]]], path: Path, title: str) -> Path:
    """Training reward against samples: per label, the mean over its seeds' (samples, reward)
    curves and a band of one sample std (seeds of one method share their sample points; a shorter
    curve, of an unfinished run, is cut to the common length)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors: dict[str, str] = {}
    for label, seeds in curves.items():
        seeds = [(x, y) for x, y in seeds if x]
        if not seeds:
            continue
        length = min(len(x) for x, _ in seeds)
        xs = seeds[0][0][:length]
        ys = [y[:length] for _, y in seeds]
        mean, std = zip(*(mean_std(col) for col in zip(*ys)))
        color = _color(label.rsplit(" (", 1)[0], colors)  # "METHOD (setting)": one colour per method
        ax.plot(xs, mean, color=color, label=f"{label}, {len(ys)} seed(s)")
        ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=color,
                        alpha=0.2, lw=0)
    ax.set_xlabel("samples (generated training responses)")
    ax.set_ylabel("training reward (mean over population/batch)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


# ----- reward-KL Pareto front ------------------------------------------------------------------------


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (KL, reward) points no other point beats on both (lower KL and higher reward), by KL."""
    front: list[tuple[float, float]] = []
    for kl, reward in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or reward > front[-1][1]:
            front.append((kl, reward))
    return front


def plot_pareto(records: list[dict[str, Any]], out: Path) -> list[Path]:
    """One figure per (env, split) of KL results: every model a point, each method's front a line."""
    plt = _pyplot()
    files = []
    for (env, split), group in group_by([r for r in records if r.get("kl_mean") is not None], ("env", "split")).items():
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        colors: dict[str, str] = {}
        for method in order_methods(r["method"] for r in group):
            points = [(r["kl_mean"], reward_of(r)) for r in group if r["method"] == method]
            color = _color(method, colors)
            marker = "*" if method == "Original" else "o"
            ax.scatter([p[0] for p in points], [p[1] for p in points], color=color, marker=marker,
                       s=120 if marker == "*" else 25, alpha=0.6, label=method, zorder=3)
            front = pareto_front(points)
            if len(front) > 1:
                ax.plot([p[0] for p in front], [p[1] for p in front], color=color, lw=2, zorder=2)
        normalised = all("normalized" in (r.get("parts_mean") or {}) for r in group)
        ax.set_xlabel("mean KL to the base model (k3, per token)")
        ax.set_ylabel("mean reward" + (" (normalised to [0, 1])" if normalised else ""))
        ax.set_title(f"{env} ({split}): reward vs KL, Pareto front per method")
        ax.ticklabel_format(useOffset=False)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        files.append(_save(fig, out / f"pareto-{_safe(env)}-{_safe(split)}.png"))
    return files


# ----- accuracy improvement over the base model ------------------------------------------------------


def improvements(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{panel: {base model: {method: pass@1 gain in points}}}`` of final models over Original;
    one panel per env (an env measured on several splits shows the mean gain over them)."""
    per_split: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for (env, split, base), group in group_by([r for r in records if is_greedy(r)], ("env", "split", "base_model")).items():
        by_method = {m: finals(rs) for (m,), rs in group_by(group, ("method",)).items()}
        if "Original" not in by_method or len(by_method) < 2:
            continue
        original = sum(r["pass@1"] for r in by_method["Original"]) / len(by_method["Original"])
        per_split.setdefault((env, split), {})[model_name(str(base))] = {
            m: 100 * (sum(r["pass@1"] for r in rs) / len(rs) - original) for m, rs in by_method.items() if m != "Original"}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for env in dict.fromkeys(env for env, _ in per_split):
        splits = [s for e, s in per_split if e == env]
        panel = f"{env} ({splits[0]})" if len(splits) == 1 else f"{env} (mean over {len(splits)} splits)"
        merged: dict[str, dict[str, list[float]]] = {}
        for split in splits:
            for base, gains in per_split[(env, split)].items():
                for method, gain in gains.items():
                    merged.setdefault(base, {}).setdefault(method, []).append(gain)
        out[panel] = {b: {m: sum(v) / len(v) for m, v in g.items()} for b, g in merged.items()}
    return out


def plot_improvement(records: list[dict[str, Any]], out: Path) -> list[Path]:
    """Grouped bars: per environment a panel, per base model a group, per method a bar."""
    gains = improvements(records)
    if not gains:
        return []
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(gains), figsize=(max(5.0, 2.2 + 1.6 * max(len(v) for v in gains.values())) * len(gains), 4.2),
                             squeeze=False)
    colors: dict[str, str] = {}
    for ax, (env, by_base) in zip(axes[0], gains.items()):
        methods = order_methods(m for row in by_base.values() for m in row)
        width = min(0.8 / len(methods), 0.3)
        for k, method in enumerate(methods):
            xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(by_base))]
            ys = [row.get(method, float("nan")) for row in by_base.values()]  # not run: no bar
            bars = ax.bar(xs, ys, width, color=_color(method, colors), label=method)
            ax.bar_label(bars, labels=["" if y != y else f"{y:+.1f}" for y in ys], fontsize=8)
        ax.set_xlim(-0.6, len(by_base) - 0.4)
        ax.set_xticks(range(len(by_base)), list(by_base), rotation=15)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel("accuracy gain over the base model (points)")
        ax.set_title(env)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return [_save(fig, out / "improvement.png")]


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    from trainers.common.config import Parser, fail

    parser = Parser(prog="python -m eval.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="RUN_OR_RESULT", help="run dirs, summary files or directories of them")
    parser.add_argument("--out", default="plots", help="output directory for the PNG files")
    parser.add_argument("--kind", choices=["curves", "pareto", "improvement", "all"], default="all")
    args = parser.parse_args(argv)
    for p in args.paths:
        if not Path(p).exists():
            fail(f"{p}: no such result file, run or directory")
    out, files = Path(args.out), []
    if args.kind in ("curves", "all"):
        files += plot_curves(find_runs(args.paths), out)
    if args.kind in ("pareto", "improvement", "all"):
        try:
            records = load_results(args.paths)
        except FileNotFoundError as exc:
            if args.kind != "all" or not files:
                fail(str(exc))
            records = []
        if args.kind in ("pareto", "all"):
            files += plot_pareto(records, out)
        if args.kind in ("improvement", "all"):
            files += plot_improvement(records, out)
    if not files:
        fail("nothing to plot (curves need trainer runs, pareto KL results, improvement Original and another method)")
    for f in files:
        print(f)
    return files


if __name__ == "__main__":
    main()
