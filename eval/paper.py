"""The paper's published numbers (Qiu et al., "Evolution Strategies at Scale", arXiv 2509.24372),
as transcribed in /work/shared/docs/PAPER_NOTES.md (Table 2's per-row values from the paper's
own table), for ``python -m eval.table --paper``."""

from __future__ import annotations

#: Table 1 method names in the paper's column order (PPO-z, GRPO-z (8), GRPO-z (30), GRPO-v,
#: Dr.GRPO-v, ES). Our harness labels Dr.GRPO runs "Dr.GRPO": the paper's Dr.GRPO-verl fills it.
TABLE1_COLUMNS: tuple[str, ...] = ("Original", "PPO", "GRPO (8)", "GRPO (30)", "GRPO-verl", "Dr.GRPO", "ES")

_TABLE1_ROWS = {
    "Qwen2.5-0.5B-Instruct": (0.1, 0.3, 0.3, 0.5, 13.0, 13.5, 14.4),
    "Qwen2.5-1.5B-Instruct": (0.7, 14.2, 13.9, 14.8, 27.8, 31.0, 37.3),
    "Qwen2.5-3B-Instruct": (10.0, 20.1, 30.9, 32.5, 37.8, 43.8, 60.5),
    "Qwen2.5-7B-Instruct": (31.2, 55.1, 54.2, 52.8, 57.0, 57.5, 66.8),
    "Llama-3.2-1B-Instruct": (0.4, 11.2, 14.5, 13.0, 14.9, 13.9, 16.8),
    "Llama-3.2-3B-Instruct": (3.2, 35.3, 39.4, 38.8, 42.5, 47.8, 51.6),
    "Llama-3.1-8B-Instruct": (8.1, 42.8, 49.9, 51.3, 46.9, 50.2, 61.2),
}

#: ``{env id: {base model: {method: accuracy %}}}``: Table 1 (Countdown) and the puzzle table.
ACCURACY: dict[str, dict[str, dict[str, float]]] = {
    "Countdown-v0": {model: dict(zip(TABLE1_COLUMNS, row)) for model, row in _TABLE1_ROWS.items()},
    "ARC-AGI-v0": {"Qwen2.5-14B": {"Original": 0.2, "ES": 29.5}},
    "Sudoku-v0": {"Qwen2.5-3B-Instruct": {"Original": 2.5, "ES": 69.5}},
}

#: Table 2 (conciseness, Qwen2.5-7B-Instruct, 4 seeds, reward normalised to [0, 1]):
#: (method, hyperparameters, reward mean, reward std, KL mean, KL std, reward hacking observed).
CONCISENESS: list[tuple[str, str, float, float, float, float, bool]] = [
    ("GRPO", "beta=0.0 lr=5e-06", 0.867, 0.054, 0.861, 0.614, True),
    ("GRPO", "beta=0.01 lr=5e-06", 0.871, 0.060, 1.354, 0.873, True),
    ("GRPO", "beta=0.0167 lr=5e-06", 0.911, 0.038, 1.591, 0.811, False),
    ("GRPO", "beta=0.0464 lr=5e-06", 0.881, 0.062, 1.384, 1.187, False),
    ("ES", "alpha=0.0005 sigma=0.001", 0.889, 0.004, 0.274, 0.096, False),
    ("ES", "alpha=0.00075 sigma=0.0015", 0.919, 0.008, 0.813, 0.212, False),
]
CONCISENESS_MODEL = "Qwen2.5-7B-Instruct"
