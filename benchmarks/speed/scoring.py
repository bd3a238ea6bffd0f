"""Scoring throughput per environment: completions scored per second on this machine.

    python -m benchmarks.speed.scoring [--n 2000] [--workers 2]

Each env scores a mix of correct and wrong completions, in this process (``score``) and through
the batched worker pool (a ``BatchScorer``). The last column compares scoring with generation:
how many seconds of scoring one second of generating those completions costs, at a typical
CPU generation speed of 100 tokens/s and 100 tokens per completion (so < 0.01 means scoring is
never the bottleneck of a training iteration).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import llm_envs
from trainers.common.config import Parser

# The real MATH files, as the tests find them: $LLM_ENVS_SHARED_DATA, else ../shared/data beside the
# checkout. Without them (and without $LLM_ENVS_MATH_DIR or the hub) MATH-v0 is reported as skipped.
SHARED_DATA = Path(os.environ.get("LLM_ENVS_SHARED_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
MATH_DIR = SHARED_DATA / "math"


def completions(env_id: str, examples) -> list[str]:
    """A correct and a wrong completion for each example, alternating."""
    out = []
    for i, ex in enumerate(examples):
        good = i % 2 == 0
        if env_id == "Countdown-v0":
            expr = ex.meta["solution"] if good else " + ".join(map(str, ex.answer["numbers"]))
            out.append(f"<think>Let me try.</think>\n<answer>{expr}</answer>")
        elif env_id == "Sudoku-v0":
            grid = ex.answer if good else ex.answer.replace("1", "2")
            out.append(f"<think>Fill it in.</think>\n<answer>\n{grid}\n</answer>")
        elif env_id == "MATH-v0":
            out.append(f"The answer is $\\boxed{{{ex.answer if good else '17'}}}$.")
        elif env_id == "Conciseness-v0":
            out.append(ex.answer if good else "I think the answer might be " + ex.answer)
        elif env_id == "ARC-AGI-v0":
            body = "return grid" if good else "return [row[::-1] for row in grid]"
            out.append(f"<reasoning>guess</reasoning>\n```python\ndef transform(grid):\n    {body}\n```")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="completions per env (ARC: n/50, sandboxed)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if MATH_DIR.is_dir():
        os.environ.setdefault("LLM_ENVS_MATH_DIR", str(MATH_DIR))
    print(f"{'env':<16}{'n':>6}{'score()/s':>12}{'batch/s':>12}{'score s per gen s':>20}")
    for env_id in llm_envs.ENV_IDS:
        env = llm_envs.make(env_id)
        split = "test"
        try:
            pool = list(env.examples(split))
        except llm_envs.DataError as exc:
            print(f"{env_id:<16} skipped: {exc}")
            continue
        n = max(10, args.n // 50) if env_id == "ARC-AGI-v0" else args.n
        examples = [pool[i % len(pool)] for i in range(n)]
        texts = completions(env_id, examples)
        start = time.perf_counter()
        single = [env.score(t, e) for t, e in zip(texts, examples)]
        t_single = time.perf_counter() - start
        with llm_envs.BatchScorer(env, args.workers) as scorer:
            scorer.score_batch(texts[:4], examples[:4])  # start the pool
            start = time.perf_counter()
            batch = scorer.score_batch(texts, examples)
            t_batch = time.perf_counter() - start
        env.close()
        assert [s.correct for s in single] == [s.correct for s in batch], env_id
        best = min(t_single, t_batch) / n
        print(f"{env_id:<16}{n:>6}{n / t_single:>12.0f}{n / t_batch:>12.0f}{best / 1.0:>20.5f}"
              f"   ({sum(s.correct for s in single)}/{n} correct)")


if __name__ == "__main__":
    main()
