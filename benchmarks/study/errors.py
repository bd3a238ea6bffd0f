"""Standard errors over distinct prompts. A test split may repeat a prompt (rg/basic_arithmetic-v0's
first 100 test items hold 82 distinct questions), and a model's greedy answers to a repeated prompt
are the same answer, so the items are not independent: an item-level standard error understates
the uncertainty of a mean over them. Every test-set standard error of the study (the verdicts'
"learned" and "moved" gates, the headline's asterisks, the tables) is clustered by prompt text
instead: the cluster-robust standard error of the mean reward, with each distinct prompt a cluster,

    SE = sqrt(G / (G - 1) * sum_g (sum_{i in g} (y_i - mean))^2) / n

over n responses in G distinct prompts. Where every prompt is distinct and one response each, it
equals the item-level sample standard error (ddof=1); sampled measurements (several responses per
prompt) cluster the same way. The study keeps what it needs: ``evals/test_prompts.json`` maps each
measured test item's id to a digest of its prompt text (``trainers.common.splits.prompt_key``), and
the completions keep every response's id and reward, so a finished study's errors are recomputed
from what it commits (``benchmarks.study.rerender.fill_errors``), and a new study records them as it measures (``reward_se``)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable

from trainers.common.config import ConfigError
from trainers.common.files import atomic_write

#: The test items' prompt digests, under the study's directory.
TEST_PROMPTS = Path("evals") / "test_prompts.json"


def prompt_groups(examples: Iterable) -> dict[str, str]:
    """Each example's id -> a digest of its prompt text (equal digests: the same question)."""
    from trainers.common.splits import prompt_key

    return {e.id: hashlib.sha256(prompt_key(e).encode()).hexdigest()[:16] for e in examples}


def write_test_prompts(out: Path, groups: dict[str, str], split: str, limit: int | None) -> Path:
    """``out/evals/test_prompts.json``: the measured split, its limit and each item's prompt digest."""
    path = out / TEST_PROMPTS
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"split": split, "limit": limit, "items": len(groups),
                                   "prompts": len(set(groups.values())), "groups": groups}, indent=1) + "\n")
    return path


def read_test_prompts(out: Path) -> dict[str, str] | None:
    """The study's item id -> prompt digest, or None where it has no ``test_prompts.json``."""
    path = out / TEST_PROMPTS
    return json.loads(path.read_text())["groups"] if path.is_file() else None


def clustered_se(rewards: list[float], prompts: list[str]) -> float:
    """The standard error of ``mean(rewards)`` clustered by ``prompts`` (each response's prompt digest;
    see the module docstring); 0.0 for fewer than two distinct prompts."""
    n, clusters = len(rewards), {}
    if n == 0:
        return 0.0
    mean = sum(rewards) / n
    for reward, prompt in zip(rewards, prompts):
        clusters[prompt] = clusters.get(prompt, 0.0) + reward - mean
    g = len(clusters)
    if g < 2:
        return 0.0
    return math.sqrt(g / (g - 1) * sum(s * s for s in clusters.values())) / n


def rows_se(rows: list[dict[str, Any]], groups: dict[str, str]) -> float:
    """``clustered_se`` of a measurement's responses (harness rows or committed completions: each
    with its item ``id`` and ``reward``); an item missing from ``groups`` is a clear error."""
    unknown = [r["id"] for r in rows if r["id"] not in groups]
    if unknown:
        raise ConfigError(f"test item {unknown[0]!r} is not in the study's {TEST_PROMPTS} (was the split changed?)")
    return clustered_se([float(r["reward"]) for r in rows], [groups[r["id"]] for r in rows])
