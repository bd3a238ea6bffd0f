"""MATH: competition mathematics with a binary, math-verify-checked reward (Qwen-Math setup).

Prompt (the Qwen-Math template): system "Please reason step by step, and put your final answer
within \\boxed{}.", user = the problem. Benchmark files that already end the problem with that
instruction have it stripped, so it is not said twice.

Reward, as in the paper: 1.0 when the LAST complete ``\\boxed{...}`` in the completion is
mathematically equal to the reference answer according to math-verify, else 0.0; no format
reward. ``parts = {"answer": reward, "boxed": 1.0 if a boxed answer was found}``. The gold answer
is parsed as ``\\boxed{answer}`` (math-verify accepts every reference of the five benchmark files
against itself). A truncated, never-closed ``\\boxed{`` does not count as an answer.

Time: sympy can spend minutes on a crafted answer, much of it in C code that no signal
interrupts, so this env scores in a worker process that is killed at ``score_timeout`` (the
default ``score_workers``; ``TaskEnv`` and ``llm_envs.scoring`` do it for ``step``, ``score`` and
``score_batch`` alike). Known-slow answers are also screened before sympy sees them, so they score
0 at once instead of at the deadline: answers over ``MAX_ANSWER_CHARS`` characters or nested
deeper than ``MAX_NESTING`` brackets, and parsed expressions holding numbers past about
``MAX_DIGITS`` digits (power towers, huge factorials). math-verify's own timeout uses
``signal.alarm``, which fails outside the main thread and would clobber the worker's per-item
timer, so it is disabled here.

Data (real data only; the first source that has a split wins):

1. ``data={"train": path, "math500": path, ...}``: JSON/JSONL rows with ``problem`` and either
   ``answer`` (LaTeX, no ``$``/``\\boxed``) or ``solution`` (the answer is its last
   ``\\boxed{}``); optional ``id``/``unique_id``, ``level``, ``subject``/``type``.
2. A directory, ``data_dir=`` or the environment variable ``LLM_ENVS_MATH_DIR``, holding the
   benchmark files by name: ``math500.jsonl``, ``aime24.jsonl``, ``amc2023.jsonl``,
   ``minervamath.jsonl``, ``olympiadbench.jsonl``, and ``train.jsonl`` for training if present.
3. The Hugging Face hub through the optional ``datasets`` package (``pip install llm-envs[hub]``):
   train = the MATH train split ("DigitalLearningGmbH/MATH-lighteval", else
   "EleutherAI/hendrycks_math"), test/math500 = "HuggingFaceH4/MATH-500". Any failure falls
   through to a ``DataError`` that says how to get the data.

Splits: ``train`` (levels 3-5 only, as in the paper, when rows carry a level; ``data=`` files
are taken whole; see ``train_levels``), ``test`` (= MATH500), and the paper's five benchmarks
``BENCHMARKS``: ``math500``, ``aime24``, ``amc23``, ``minerva``, ``olympiadbench`` (pass@1).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from os import PathLike
from pathlib import Path
from typing import Any

from llm_envs.core import TaskEnv, chat
from llm_envs.data import DataError, FieldError, load_rows, require
from llm_envs.registry import register
from llm_envs.types import Example, Score

#: The Qwen-Math system prompt used by the paper.
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
#: Environment variable naming a directory of benchmark files (see the module docstring).
DATA_DIR_ENV = "LLM_ENVS_MATH_DIR"
#: The paper's five MATH benchmarks (split names): the env's evaluation splits.
BENCHMARKS: tuple[str, ...] = ("math500", "aime24", "amc23", "minerva", "olympiadbench")
#: File each split is read from in a data directory.
SPLIT_FILES: dict[str, str] = {
    "train": "train.jsonl",
    "test": "math500.jsonl",
    "math500": "math500.jsonl",
    "aime24": "aime24.jsonl",
    "amc23": "amc2023.jsonl",
    "minerva": "minervamath.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
}
#: Hub datasets tried per split: (path, config names or None, split).
HUB_SOURCES: dict[str, list[tuple[str, tuple[str, ...] | None, str]]] = {
    "train": [
        ("DigitalLearningGmbH/MATH-lighteval", None, "train"),
        ("EleutherAI/hendrycks_math", (
            "algebra", "counting_and_probability", "geometry", "intermediate_algebra",
            "number_theory", "prealgebra", "precalculus"), "train"),
    ],
    "test": [("HuggingFaceH4/MATH-500", None, "test")],
    "math500": [("HuggingFaceH4/MATH-500", None, "test")],
}

MAX_ANSWER_CHARS = 1000  # longest reference in the benchmark files: 210
MAX_NESTING = 12  # deepest bracket nesting in the references: 4; parsing slows with depth
MAX_DIGITS = 100_000  # 10**(10**5) takes ~10 ms; 10**(10**6) already ~0.4 s, uninterruptible

_INSTRUCTION = re.compile(
    r"\s*Please reason step by step,? and put your final answer within \\boxed\{\}\.?\s*$"
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# An escaped pair (\{, \}, \\) is not a grouping brace; consuming it keeps "\\{" right.
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)


# We disable math-verify's signal-based timeouts on purpose (see the docstring); its one-time
# warning about that would only alarm users, so it is filtered out.
class _NoTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutWarning())


# ----- answer extraction ---------------------------------------------------------------------------
def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched (escaped ``\\{``/``\\}`` ignored), so nested groups such as
    ``\\boxed{\\frac{1}{2}}`` come out whole. One linear pass, whatever the text.
    """
    starts = [m.end() - 1 for m in _BOXED.finditer(text)]  # positions of the opening braces
    if not starts:
        return None
    closing: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKENS.finditer(text, starts[0]):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            closing[stack.pop()] = token.start()
    for start in reversed(starts):
        if start in closing:
            return text[start + 1 : closing[start]].strip()
    return None


def strip_instruction(problem: str) -> str:
    """``problem`` without a trailing "Please reason step by step, ... \\boxed{}." instruction."""
    return _INSTRUCTION.sub("", problem).strip()


def _nesting(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")}]":
            depth = max(0, depth - 1)
    return deepest


# ----- verification ---------------------------------------------------------------------------------
def _parse(answer: str) -> list[Any]:
    from math_verify import LatexExtractionConfig, parse

    # parsing_timeout=None: no signal.alarm (thread-safe; leaves the scorer's timer alone).
    return parse("\\boxed{" + answer + "}", [LatexExtractionConfig(boxed_match_priority=0)],
                 parsing_timeout=None)


@lru_cache(maxsize=16_384)
def _parse_gold(answer: str) -> tuple[Any, ...]:
    # References repeat across a population's completions: parse each once per process.
    return tuple(_parse(answer))


def _log10_bound(expr: Any) -> float:
    """A rough upper bound on log10 |value| of a numeric sympy subtree (a symbol counts as 1)."""
    import sympy

    if isinstance(expr, sympy.Integer):
        return math.log10(abs(int(expr))) if expr != 0 else 0.0
    if isinstance(expr, sympy.Rational):
        return max(math.log10(abs(expr.p)), math.log10(expr.q))
    if isinstance(expr, sympy.Float):
        try:
            return math.log10(abs(float(expr)) + 1.0)
        except (OverflowError, ValueError):
            return math.inf
    args = getattr(expr, "args", ())
    if not args or not isinstance(expr, sympy.Basic):
        return 0.0
    bounds = [_log10_bound(a) for a in args]
    if isinstance(expr, sympy.Pow):
        # |b**e| <= 10**(|e| * log10|b|); the exponent's size matters even when it is negative
        # (a huge denominator). Exponents past 10**12 are rejected outright.
        base, exponent = bounds
        return math.inf if exponent > 12 else base * 10.0**exponent
    if isinstance(expr, sympy.factorial):
        # log10(n!) <= n * log10(n)
        return math.inf if bounds[0] > 12 else 10.0 ** bounds[0] * bounds[0]
    if isinstance(expr, sympy.Mul):
        return sum(bounds)
    return max(bounds) + math.log10(len(bounds))


def _too_big(parsed: Sequence[Any]) -> bool:
    try:
        return any(_log10_bound(p) > MAX_DIGITS for p in parsed if not isinstance(p, str))
    except RecursionError:
        return True


def answers_match(prediction: str, gold: str) -> bool:
    """Whether the answer ``prediction`` (LaTeX, no ``\\boxed``) equals ``gold`` per math-verify.

    No signal-based timeout is used (safe from any thread); oversized or deeply nested
    predictions, and ones holding astronomically large numbers, are rejected without sympy.
    """
    from math_verify import verify

    if not prediction or len(prediction) > MAX_ANSWER_CHARS or _nesting(prediction) > MAX_NESTING:
        return False
    predicted = _parse(prediction)
    if not predicted or _too_big(predicted):
        return False
    return bool(verify(list(_parse_gold(gold)), predicted, timeout_seconds=None))


# ----- the environment -------------------------------------------------------------------------------
class MathEnv(TaskEnv):
    """Competition math (MATH train; MATH500, AIME24, AMC23, Minerva, OlympiadBench eval).

    Args:
        data: ``{split: path}`` of JSON/JSONL files (rows: ``problem`` + ``answer`` or
            ``solution``); they take precedence over every other source.
        seed: seed of the episode API's example draws.
        data_dir: directory holding the benchmark files by name; defaults to
            ``$LLM_ENVS_MATH_DIR``.
        hub: try the Hugging Face hub (needs ``datasets`` and network) when no file has a split.
        train_levels: MATH difficulty levels kept in the ``train`` split read from ``data_dir`` or
            the hub (rows without a level are kept; a ``data=`` file is taken whole); ``None``
            keeps all. The paper trains on levels 3-5.
        opening: a string opens the assistant's turn of every example with it (none by default).
    """

    split_names = ("train", "test", *BENCHMARKS)
    eval_splits = BENCHMARKS
    #: Default generation budget (the paper allowed up to 3000 new tokens; 1024 covers most
    #: Qwen2.5-Math solutions at a third of the cost; raise it to match the paper).
    max_new_tokens = 1024

    def __init__(
        self,
        data: Mapping[str, str | PathLike] | None = None,
        seed: int = 0,
        data_dir: str | PathLike | None = None,
        hub: bool = True,
        train_levels: Sequence[int] | None = (3, 4, 5),
        opening: bool | str = True,
    ):
        super().__init__(data=data, seed=seed, opening=opening)
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.hub = bool(hub)
        self.train_levels = None if train_levels is None else frozenset(int(x) for x in train_levels)

    # ----- data ---------------------------------------------------------------------------------
    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        """A row of a ``data=`` file; its id is the row's ``id``/``unique_id``, else "math-<index>"."""
        return self._example(row, index, "math")

    def _example(self, row: Mapping[str, Any], index: int, prefix: str) -> Example:
        problem = strip_instruction(require(row, "problem"))
        if not problem:
            raise FieldError("problem", "empty")
        if "answer" in row:
            answer = str(require(row, "answer", (str, int, float))).strip()
            if not answer:
                raise FieldError("answer", "empty")
        elif "solution" in row:
            answer = last_boxed(require(row, "solution"))
            if not answer:
                raise FieldError("solution", "holds no \\boxed{...} answer")
        else:
            raise FieldError("answer", "missing (and no 'solution' with a \\boxed{} answer)")
        raw_id = row.get("id", row.get("unique_id"))
        meta: dict[str, Any] = {}
        level = _level(row.get("level"))
        if level is not None:
            meta["level"] = level
        subject = row.get("subject", row.get("type"))
        if isinstance(subject, str):
            meta["subject"] = subject
        return Example(
            id=str(raw_id) if isinstance(raw_id, (str, int)) else f"{prefix}-{index}",
            prompt=chat(problem, system=SYSTEM_PROMPT),
            answer=answer,
            meta=meta,
        )

    def build_split(self, split: str) -> list[Example]:
        prefix = "math500" if split == "test" else split
        directory = self._directory()
        if directory is not None and (directory / SPLIT_FILES[split]).is_file():
            examples = self._read(directory / SPLIT_FILES[split], prefix)
        else:
            hub_error = self._hub_examples(split, prefix)
            if isinstance(hub_error, str):
                raise DataError(self._missing_message(split, directory, hub_error))
            examples = hub_error
        if split == "train" and self.train_levels is not None:
            examples = [e for e in examples if e.meta.get("level") in self.train_levels
                        or "level" not in e.meta]
        if not examples:
            raise DataError(f"MATH-v0: split {split!r} holds no examples")
        return examples

    def _directory(self) -> Path | None:
        if self.data_dir is not None:
            directory, origin = self.data_dir, "data_dir"
        elif os.environ.get(DATA_DIR_ENV):
            directory, origin = Path(os.environ[DATA_DIR_ENV]), f"${DATA_DIR_ENV}"
        else:
            return None
        if not directory.is_dir():
            raise DataError(f"MATH-v0: {origin}={str(directory)!r} is not a directory")
        return directory

    def _read(self, path: Path, prefix: str) -> list[Example]:
        examples = []
        for index, row in enumerate(load_rows(path)):
            try:
                examples.append(self._example(row, index, prefix))
            except FieldError as exc:
                raise DataError(f"{path}: row {index}: field {exc.field!r}: {exc}") from None
        return examples

    def _hub_examples(self, split: str, prefix: str) -> list[Example] | str:
        """The split from the Hugging Face hub, or a string saying why not."""
        if not self.hub:
            return "hub disabled (hub=False)"
        if split not in HUB_SOURCES:
            return f"no hub source for {split!r}"
        try:
            import datasets  # optional dependency
        except ImportError:
            return "the optional 'datasets' package is not installed"
        reasons = []
        for path, configs, hub_split in HUB_SOURCES[split]:
            try:
                rows: list[dict[str, Any]] = []
                for config in configs or (None,):
                    rows.extend(datasets.load_dataset(path, config, split=hub_split))
                return [self._example(row, i, prefix) for i, row in enumerate(rows)]
            except Exception as exc:  # offline, renamed, changed schema: try the next source
                reasons.append(f"{path}: {type(exc).__name__}: {str(exc)[:200]}")
        return "; ".join(reasons)

    def _missing_message(self, split: str, directory: Path | None, hub_reason: str) -> str:
        file = SPLIT_FILES[split]
        where = (f"{directory} has no {file}" if directory is not None
                 else f"neither data_dir= nor ${DATA_DIR_ENV} is set")
        return (
            f"MATH-v0 has no data for split {split!r} ({where}; hub: {hub_reason}). To get it: "
            f"set {DATA_DIR_ENV} (or pass data_dir=) to a directory holding {file} "
            f"(JSONL rows with 'problem' and 'answer'); or pass data={{{split!r}: path}}; "
            f"or `pip install datasets` with access to the Hugging Face hub "
            f"(provides train and test/math500 only)."
        )

    # ----- reward ---------------------------------------------------------------------------------
    def prepare_scoring(self) -> None:
        """Import math-verify and sympy (about a second) before a worker's first item."""
        _parse_gold("1")

    def score_completion(self, completion: str, example: Example) -> Score:
        prediction = last_boxed(completion)
        if prediction is None:
            return Score(0.0, False, {"answer": 0.0, "boxed": 0.0})
        reward = 1.0 if answers_match(prediction, str(example.answer)) else 0.0
        return Score(reward, reward == 1.0, {"answer": reward, "boxed": 1.0})


def _level(value: Any) -> int | None:
    """A MATH level as an int: 3 from 3, "3" or "Level 3"; None when absent or unknown."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        match = re.search(r"\d+", value)
        return int(match.group()) if match else None
    return None


register("MATH-v0", MathEnv)
