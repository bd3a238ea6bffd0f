"""Rebuild an ES run's model from its base weights and its logged seeds and coefficients.

    python -m trainers.es.replay runs/es-Countdown-v0-... --out rebuilt/ [--iteration 200]

The update log (``updates.jsonl``, a few KB) is the whole training result: this needs no
weight checkpoint. CPU and CUDA random generators differ, so noise is regenerated on the kind of
device the run used (recorded in ``noise_device.json``); another kind is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainers.common.config import ConfigError, Parser, build_config, fail, load_yaml
from trainers.common.models import load_model, save_model
from trainers.common.run_dir import read_jsonl, recorded_dtype
from trainers.es.update_log import NOISE_DEVICE_FILE, UPDATES_FILE, check_noise_device
from trainers.es.train import ESConfig, perturbable, replay, with_adapters


def rebuild(run_dir: str | Path, iteration: int | None = None, device: str | None = None):
    """(model, tokenizer) of ``run_dir`` after ``iteration`` (default: the last logged one)."""
    run_dir = Path(run_dir)
    cfg = build_config(ESConfig, load_yaml(run_dir / "config.yaml"))
    updates = [u for u in read_jsonl(run_dir / UPDATES_FILE) if iteration is None or u["iteration"] <= iteration]
    if device is None and (run_dir / NOISE_DEVICE_FILE).is_file():
        device = json.loads((run_dir / NOISE_DEVICE_FILE).read_text())["device"]
    # the dtype it trained in, as its first start recorded it: its seeds rebuild its weights only in it
    dtype = recorded_dtype(run_dir) or cfg.dtype
    try:
        model, tokenizer = load_model(cfg.model, device=device or cfg.device, dtype=dtype)
    except ValueError as exc:  # e.g. a CUDA run replayed where there is no CUDA
        raise ConfigError(f"{run_dir}: {exc}") from None
    check_noise_device(run_dir, next(model.parameters()).device)
    model = with_adapters(model, cfg)  # the adapters' start is drawn from the run seed too
    replay(cfg, *perturbable(model, cfg), updates)
    return model, tokenizer, (updates[-1]["iteration"] if updates else 0)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="where to save the rebuilt model (Hugging Face format)")
    parser.add_argument("--iteration", type=int, help="stop after this iteration (default: the last)")
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "config.yaml").exists():
        fail(f"{args.run_dir}: not an ES run directory (config.yaml missing)")
    try:
        model, tokenizer, last = rebuild(args.run_dir, args.iteration, args.device)
    except ConfigError as exc:
        fail(str(exc))
    save_model(model, tokenizer, args.out)
    print(f"rebuilt {args.run_dir} after iteration {last} -> {args.out}")


if __name__ == "__main__":
    main()
