"""Measure a model on an environment: greedy pass@1 (the paper's protocol), unbiased pass@k from
sampled responses, and KL from a base model, with per-example results and a summary on disk.

The command line; the harness itself is ``eval.harness``.

    python -m eval --env Countdown-v0 --model smollm2-135m --limit 200
    python -m eval --env Countdown-v0 --model runs/es-Countdown-v0-...      # a trainer run's final/
    python -m eval --env MATH-v0 --model Qwen/Qwen2.5-Math-7B               # the five MATH benchmarks
    python -m eval --env Conciseness-v0 --model RUN --preset conciseness    # 20 samples, KL to the base
    python -m eval --env Countdown-v0 --samples 8 --temperature 0.7         # pass@1..8 and pass^1..8
    python -m eval --env Countdown-v0 -n 20 -r 4                            # 20 examples x 4 rollouts

Writes OUT/ENV.SPLIT.TAG.jsonl (one line per response) and OUT/ENV.SPLIT.TAG.summary.json (what
``python -m eval.table`` reads); ``python -m eval --help`` lists every option. Killed, the same
command resumes from the generations it cached.
"""

from __future__ import annotations

import sys
from typing import Any

from eval.harness import EvalConfig, run
from trainers.common.config import USER_ERRORS, fail, parse_config


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    cfg = parse_config(EvalConfig, argv, description=__doc__.split("\n\n")[0])
    try:
        return run(cfg)
    except USER_ERRORS as exc:
        fail(str(exc))


if __name__ == "__main__":
    sys.argv[0] = "python -m eval"  # argparse's program name in usage lines
    main()
