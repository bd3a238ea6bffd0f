"""Merge a LoRA run's adapter into its base model: a full model in Hugging Face format.

    python -m trainers.merge runs/grpo-Countdown-v0-.../final --out merged/
    python -m trainers.merge runs/es-Countdown-v0-... --out merged/     # a run directory: its final/

The adapter directory (``final/`` or a checkpoint of a run trained with ``--lora-rank``) names its
base model (``base_model_name_or_path``); the base is loaded in fp32, the adapter added into its
weights (PEFT's ``merge_and_unload``: W + alpha / R * B A) and the result saved with the tokenizer,
so that ``AutoModelForCausalLM.from_pretrained(out)`` and every command here load it as a plain model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainers.common import adapters
from trainers.common.config import Parser, fail
from trainers.common.models import load_model, save_model


def adapter_dir(path: str | Path) -> Path:
    """The adapter directory ``path`` names: itself, or a run directory's ``final/``."""
    path = Path(path)
    for candidate in (path, path / "final"):
        if adapters.is_adapter_dir(candidate):
            return candidate
    raise OSError(f"{path}: not a LoRA adapter (no {adapters.ADAPTER_CONFIG}), nor a run directory whose final/ is one; "
                  f"a run trained without --lora-rank already saved a full model")


def merge(path: str | Path, out: str | Path, device: str | None = "cpu") -> Path:
    """Write the merged full model of the adapter at ``path`` (or a run's ``final/``) to ``out``."""
    model, tokenizer = load_model(adapter_dir(path), device=device, dtype=torch.float32)
    return save_model(adapters.merged(model), tokenizer, out)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("adapter", help="an adapter directory (a LoRA run's final/ or checkpoint) or the run directory")
    parser.add_argument("--out", required=True, help="where to save the merged model (Hugging Face format)")
    parser.add_argument("--device", default="cpu", help="where to merge (default: cpu)")
    args = parser.parse_args(argv)
    try:
        out = merge(args.adapter, args.out, args.device)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    print(f"merged {args.adapter} into its base -> {out}")


if __name__ == "__main__":
    main()
