"""Rebuild an ES run's model from its base weights and its logged seeds and coefficients.

    python -m trainers.replay runs/es-Countdown-v0-... --out rebuilt/ [--iteration 200]

The update log (``updates.jsonl``, a few KB) is the whole training result: this needs no
weight checkpoint. Noise is generated on the device the run used; replay on the same kind of
device (CPU or CUDA) to get the same weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainers.config import build_config, fail, load_yaml
from trainers.es import ESConfig, perturbable, replay
from trainers.models import load_model, save_model
from trainers.run_dir import read_jsonl


def rebuild(run_dir: str | Path, iteration: int | None = None, device: str | None = None):
    """(model, tokenizer) of ``run_dir`` after ``iteration`` (default: the last logged one)."""
    run_dir = Path(run_dir)
    cfg = build_config(ESConfig, load_yaml(run_dir / "config.yaml"))
    updates = [u for u in read_jsonl(run_dir / "updates.jsonl") if iteration is None or u["iteration"] <= iteration]
    model, tokenizer = load_model(cfg.model, device=device or cfg.device, dtype=cfg.dtype)
    replay(cfg, *perturbable(model, cfg), updates)
    return model, tokenizer, (updates[-1]["iteration"] if updates else 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="where to save the rebuilt model (Hugging Face format)")
    parser.add_argument("--iteration", type=int, help="stop after this iteration (default: the last)")
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "config.yaml").exists():
        fail(f"{args.run_dir}: not an ES run directory (config.yaml missing)")
    model, tokenizer, last = rebuild(args.run_dir, args.iteration, args.device)
    save_model(model, tokenizer, args.out)
    print(f"rebuilt {args.run_dir} after iteration {last} -> {args.out}")


if __name__ == "__main__":
    main()
