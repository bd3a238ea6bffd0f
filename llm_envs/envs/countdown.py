"""Countdown: combine the given numbers with + - * / to reach a target (TinyZero style).

The model sees e.g. "Using the numbers [44 19 35], create an equation that equals 98. ..." and
must reason in ``<think>...</think>`` and answer in ``<answer>...</answer>``.

Reward, as in the paper (TinyZero's rule): ``reward = 0.1 * format + answer``, so 1.1 is perfect.

- ``format`` is 1.0 when the assistant's turn (surrounding whitespace stripped; from the
  opening's ``<think>`` on, see below) matches
  ``^<think>.*?</think>\\n<answer>.*?</answer>$`` (DOTALL); otherwise 0.1 if it holds a
  ``<think>...</think>`` block plus 0.5 if it holds an ``<answer>...</answer>`` block
  (so 0, 0.1, 0.5, 0.6 or 1.0).
- ``answer`` is 1.0 when the LAST answer block is an arithmetic expression over non-negative
  integer literals, ``+ - * /`` and parentheses that uses exactly the given numbers, each once
  (multiset equality), and equals the target within 1e-5; else 0. ``correct`` is ``answer == 1``.

Only the assistant's turn is scored (tags in the user's prompt never count). The answer is parsed with
``ast`` and evaluated by walking the tree with exact ``Fraction`` arithmetic; model text is never
run. Accepted beyond the paper's rule: ``×``/``÷``/``−`` are read as ``*``/``/``/``-``, and a trailing
``= <target>`` is dropped (a trailing ``=`` followed by any other number makes the answer wrong).
Rejected: unary minus/plus (it would let a number be used in a way + - * / between the given
numbers does not allow), ``**``, ``//``, ``%``, decimal or exponent literals, names, calls, and
answers longer than 200 characters.

The prompt is the paper's (its Countdown data file's ``context``, TinyZero's template): the
system prompt ("You are a helpful assistant. You first think about ...") as a system message
(``system_prompt=None`` drops it, a string replaces it), the task as the user's, and the
assistant's turn opened with "Let me solve this step by step.\\n<think>" (``OPENING``), which the
model continues (``opening=False`` turns it off). The scorer sees the whole assistant turn, opening
included, and checks the format from the opening's ``<think>`` on, as the paper's code checks
``"<think>" + completion``: a completion that closes ``</think>`` and then answers earns the full
format score. Without an opening the whole turn must match the format.

Built-in data: an offline generator (default 200 train / 2000 test, disjoint, deterministic in
``seed``): 3-4 numbers drawn from 1-99, then a target drawn uniformly from the integers in 10-100
those numbers can reach using every number once, so every puzzle is solvable; one solution is
kept in ``meta["solution"]`` (re-checked exactly by the scorer's own evaluator).

Own data (``data={"test": path}``): rows with ``numbers`` (or ``nums``: a list of non-negative
ints) and ``target`` (an int, a float, or a string holding a number, as in the paper's own JSON
file), optional ``id`` (else the row index) and ``solution``. Non-integer or negative targets
(about 3% of the paper's test file, which its reference grader always failed) load and are graded
like any other, within 1e-5. The row's ``context`` is ignored: the prompt is always rebuilt from
the numbers and the target. The generated train split skips every puzzle of the test split,
including a test split read from a file.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from os import PathLike
from typing import Any

from llm_envs.core import TaskEnv, chat
from llm_envs.data import FieldError, require
from llm_envs.parsing import last_tag
from llm_envs.registry import register
from llm_envs.types import Example, Score

#: The paper's system prompt (its Countdown input starts with it).
PAPER_SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer."
)

PROMPT = (
    "Using the numbers [{numbers}], create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>."
)

#: How the paper's prompt opens the assistant's turn (every ``context`` of its data file ends so).
OPENING = "Let me solve this step by step.\n<think>"

MAX_ANSWER_CHARS = 200
MAX_LITERAL = 10**6
TOLERANCE = Fraction(1, 10**5)


# ----- format reward ----------------------------------------------------------------------------
_MIDDLE = "</think>\n<answer>"


def format_reward(completion: str, lead: str = "") -> float:
    """The paper's format score of a completion: 1.0, or 0.1 (think block) + 0.5 (answer block).

    Same result as the regexes ``^<think>.*?</think>\\n<answer>.*?</answer>$``,
    ``<think>.*?</think>`` and ``<answer>.*?</answer>`` (DOTALL) on the stripped text, but done
    with ``str.find`` so that adversarial text (thousands of unclosed tags) stays linear-time.
    A text that starts with ``lead`` (an opening's words before its ``<think>``) is checked from
    after it.
    """
    text = completion.strip()
    if lead.strip() and text.startswith(lead.strip()):
        text = text[len(lead.strip()):].lstrip()
    if text.startswith("<think>") and text.endswith("</answer>"):
        middle = text.find(_MIDDLE, len("<think>"))
        if middle >= 0 and middle + len(_MIDDLE) <= len(text) - len("</answer>"):
            return 1.0
    return 0.1 * _has_block(text, "think") + 0.5 * _has_block(text, "answer")


def _has_block(text: str, tag: str) -> bool:
    start = text.find(f"<{tag}>")
    return start >= 0 and text.find(f"</{tag}>", start + len(tag) + 2) >= 0


def extract_answer(completion: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` block, or ``None``."""
    end = completion.rfind("</answer>")
    if end < 0:
        return None
    # Cutting after the last closing tag keeps the regex linear (no unclosed tag to rescan).
    return last_tag(completion[: end + len("</answer>")], "answer")


# ----- answer checking --------------------------------------------------------------------------
class ExpressionError(ValueError):
    """The answer is not an allowed arithmetic expression."""


_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() \t\r\n]+")
_TRAILING_EQUALS = re.compile(r"=\s*(-?[0-9]+(?:\.[0-9]+)?)\s*$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses, in order.

    Only non-negative int literals, binary ``+ - * /`` and parentheses are allowed; anything
    else (and division by zero) raises ``ExpressionError``. Never evaluates the text as code.
    """
    if len(text) > MAX_ANSWER_CHARS:
        raise ExpressionError(f"answer longer than {MAX_ANSWER_CHARS} characters")
    if not _ALLOWED_CHARS.fullmatch(text):
        raise ExpressionError("only digits, + - * / and parentheses are allowed")
    try:
        # Whitespace (newlines included) only separates tokens; one line parses in eval mode.
        tree = ast.parse(" ".join(text.split()), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExpressionError("not a valid expression") from None
    used: list[int] = []
    try:
        value = _walk(tree.body, used)
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None
    return value, used


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, used), _walk(node.right, used)
        if right == 0 and type(node.op) is ast.Div:
            raise ExpressionError("division by zero")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if node.value > MAX_LITERAL:
            raise ExpressionError(f"number larger than {MAX_LITERAL}")
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp):
        raise ExpressionError(f"operator {type(node.op).__name__} not allowed")
    raise ExpressionError(f"{type(node).__name__} not allowed")


def check_answer(answer: str, numbers: Sequence[int], target: int | float) -> tuple[bool, str | None]:
    """Whether ``answer`` uses exactly ``numbers`` (each once) and equals ``target`` within 1e-5.

    Returns ``(correct, error)``; ``error`` says why an answer could not be read (``None`` for
    a well-formed answer, right or wrong).
    """
    text = answer.replace("×", "*").replace("÷", "/").replace("−", "-").strip()
    if len(text) > MAX_ANSWER_CHARS:  # before any regex: bounds the work on hostile input
        return False, f"answer longer than {MAX_ANSWER_CHARS} characters"
    claimed = _TRAILING_EQUALS.search(text)
    if claimed:
        # "expr = 98" is the expression plus its claimed value; only the target is accepted.
        if abs(Fraction(claimed.group(1)) - Fraction(target)) >= TOLERANCE:
            return False, None
        text = text[: claimed.start()].strip()
    if not text:
        return False, "empty answer"
    try:
        value, used = evaluate_expression(text)
    except ExpressionError as exc:
        return False, str(exc)
    ok = sorted(used) == sorted(numbers) and abs(value - Fraction(target)) < TOLERANCE
    return ok, None


# ----- solver -------------------------------------------------------------------------------------
# An expression is a tree of tuples: (text,) for a number, (op, left, right) otherwise; text is
# only built for the expressions kept (building strings for every candidate would dominate).
Expr = tuple


def render(expr: Expr) -> str:
    """An expression tree as text with minimal parentheses, e.g. ``(56 + 94) / (90 - 75)``."""
    return _render(expr)[0]


def _render(expr: Expr) -> tuple[str, int]:
    if len(expr) == 1:
        return expr[0], 3
    op, left, right = expr
    prec = 1 if op in "+-" else 2
    (a, pa), (b, pb) = _render(left), _render(right)
    if pa < prec:
        a = f"({a})"
    if pb < prec or (pb == prec and op in "-/"):  # a - (b + c), a / (b * c)
        b = f"({b})"
    return f"{a} {op} {b}", prec


def _splits(mask: int) -> list[tuple[int, int]]:
    """Unordered pairs (sub, rest) of non-empty disjoint subsets whose union is ``mask``."""
    out = []
    sub = (mask - 1) & mask
    while sub:
        rest = mask ^ sub
        if sub < rest:
            out.append((sub, rest))
        sub = (sub - 1) & mask
    return out


def _tables(numbers: Sequence[int], exact: bool, full: bool) -> list[dict]:
    """For each subset (bitmask) of ``numbers``: ``{value: expr}`` of every value reachable using
    all of that subset, each number once, with + - * / (both orders for - and /).

    ``exact`` computes with ``Fraction``; otherwise with floats (several times faster; a float
    may then stand for one value twice, which only costs time, and callers re-check exactly
    what they keep). ``full=False`` skips the whole set, the most expensive one.
    """
    n = len(numbers)
    tables: list[dict] = [{} for _ in range(1 << n)]
    for i, x in enumerate(numbers):
        tables[1 << i][Fraction(x) if exact else float(x)] = (str(x),)
    for mask in range(1, (1 << n) if full else (1 << n) - 1):
        if mask & (mask - 1) == 0:
            continue
        out = tables[mask]
        for sub, rest in _splits(mask):
            for a, ea in tables[sub].items():
                for b, eb in tables[rest].items():
                    # Inlined (no helper, no candidate list): this loop is the generator's cost.
                    v = a + b
                    if v not in out:
                        out[v] = ("+", ea, eb)
                    v = a * b
                    if v not in out:
                        out[v] = ("*", ea, eb)
                    v = a - b
                    if v not in out:
                        out[v] = ("-", ea, eb)
                    v = b - a
                    if v not in out:
                        out[v] = ("-", eb, ea)
                    if b:
                        v = a / b
                        if v not in out:
                            out[v] = ("/", ea, eb)
                    if a:
                        v = b / a
                        if v not in out:
                            out[v] = ("/", eb, ea)
    return tables


def reachable_values(numbers: Sequence[int]) -> dict[Fraction, str]:
    """Every exact value reachable from ``numbers`` (all used, each once), with one expression.

    Exhaustive and exact (``Fraction``): the reference solver; ~15 ms for 4 numbers.
    """
    if not numbers:
        return {}
    return {v: render(e) for v, e in _tables(numbers, exact=True, full=True)[-1].items()}


def solve(numbers: Sequence[int], target: int | float | Fraction) -> str | None:
    """An expression using every number once that equals ``target`` exactly, or ``None``."""
    return reachable_values(numbers).get(Fraction(target))


def reachable_targets(numbers: Sequence[int], lo: int, hi: int) -> dict[int, str]:
    """The integers in ``[lo, hi]`` reachable from ``numbers`` (all used, each once), each with
    one expression: the generator's fast float search (~0.4 ms for 4 numbers).

    Floats are safe here: a value of a few small numbers is either an integer or far (>> 1e-9)
    from one, and the generator re-checks every kept solution exactly anyway.
    ``reachable_values`` is the exact reference it is tested against.
    """
    return {t: render(e) for t, e in _target_exprs(numbers, lo, hi).items()}


def _target_exprs(numbers: Sequence[int], lo: int, hi: int) -> dict[int, Expr]:
    if len(numbers) == 1:
        return {numbers[0]: (str(numbers[0]),)} if lo <= numbers[0] <= hi else {}
    tables = _tables(numbers, exact=False, full=False)
    lo_f, hi_f = lo - 1e-9, hi + 1e-9
    hits: dict[int, Expr] = {}
    # The whole set is most of the work and only in-range integers matter, so each candidate
    # gets two comparisons and a float modulo (near an integer?) before anything is built.
    # Inlined by hand: a helper call per candidate doubles the generator's run time.
    for sub, rest in _splits((1 << len(numbers)) - 1):
        right = list(tables[rest].items())
        for a, ea in tables[sub].items():
            for b, eb in right:
                v = a + b
                if lo_f <= v <= hi_f and (v + 1e-9) % 1.0 < 2e-9 and round(v) not in hits:
                    hits[round(v)] = ("+", ea, eb)
                v = a * b
                if lo_f <= v <= hi_f and (v + 1e-9) % 1.0 < 2e-9 and round(v) not in hits:
                    hits[round(v)] = ("*", ea, eb)
                v = a - b
                if lo_f <= v <= hi_f and (v + 1e-9) % 1.0 < 2e-9 and round(v) not in hits:
                    hits[round(v)] = ("-", ea, eb)
                v = b - a
                if lo_f <= v <= hi_f and (v + 1e-9) % 1.0 < 2e-9 and round(v) not in hits:
                    hits[round(v)] = ("-", eb, ea)
                if b:
                    v = a / b
                    if lo_f <= v <= hi_f and (v + 1e-9) % 1.0 < 2e-9 and round(v) not in hits:
                        hits[round(v)] = ("/", ea, eb)
                if a:
                    v = b / a
                    if lo_f <= v <= hi_f and (v + 1e-9) % 1.0 < 2e-9 and round(v) not in hits:
                        hits[round(v)] = ("/", eb, ea)
    return hits


# ----- the environment ----------------------------------------------------------------------------
class CountdownEnv(TaskEnv):
    """Countdown puzzles with the paper's format + answer reward.

    Args:
        data: ``{split: path}`` of JSON/JSONL files that replace the generated splits.
        seed: seed of the generator (same seed, same splits; train and test never share a
            puzzle, i.e. the same sorted numbers and target).
        train_size, test_size: number of generated puzzles per split (paper: 200 / 2000).
        min_numbers, max_numbers: how many numbers a puzzle has (drawn uniformly).
        min_number, max_number: range of each number.
        min_target, max_target: range of the (integer) target.
        system_prompt: system message; the paper's by default, ``None`` for none.
        opening: ``True``: the paper's opening of the assistant's turn (``OPENING``); ``False``:
            none; a string: that opening instead.
    """

    max_new_tokens = 512
    score_workers = 0  # cheap pure-Python scoring, no long C calls: timed in-process, workers only add overhead
    opening = OPENING

    def __init__(
        self,
        data: Mapping[str, str | PathLike] | None = None,
        seed: int = 0,
        train_size: int = 200,
        test_size: int = 2000,
        min_numbers: int = 3,
        max_numbers: int = 4,
        min_number: int = 1,
        max_number: int = 99,
        min_target: int = 10,
        max_target: int = 100,
        system_prompt: str | None = PAPER_SYSTEM_PROMPT,
        opening: bool | str = True,
    ):
        super().__init__(data=data, seed=seed, opening=opening)
        if not 2 <= min_numbers <= max_numbers <= 5:  # 5 numbers: ~10 ms a puzzle; 6: ~30x that
            raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 5, got {min_numbers}, {max_numbers}")
        if not 0 <= min_number <= max_number <= MAX_LITERAL:
            raise ValueError(f"need 0 <= min_number <= max_number <= {MAX_LITERAL}")
        if min_target > max_target:
            raise ValueError(f"min_target {min_target} > max_target {max_target}")
        if train_size < 0 or test_size < 0:
            raise ValueError("split sizes must be >= 0")
        self.sizes = {"train": int(train_size), "test": int(test_size)}
        self.min_numbers, self.max_numbers = int(min_numbers), int(max_numbers)
        self.min_number, self.max_number = int(min_number), int(max_number)
        self.min_target, self.max_target = int(min_target), int(max_target)
        self.system_prompt = system_prompt

    # ----- prompts and examples -----
    def make_example(self, example_id: str, numbers: Sequence[int], target: int | float,
                     solution: str | None = None) -> Example:
        """An example for ``numbers`` and ``target`` with the TinyZero prompt (and this env's opening)."""
        numbers = [int(x) for x in numbers]
        user = PROMPT.format(numbers=" ".join(map(str, numbers)), target=target)
        meta: dict[str, Any] = {"numbers": list(numbers), "target": target}
        if solution is not None:
            meta["solution"] = solution
        example = Example(example_id, chat(user, self.system_prompt), {"numbers": numbers, "target": target}, meta)
        return self._open(example)

    def build_split(self, split: str) -> list[Example]:
        if split not in self.sizes:
            return super().build_split(split)
        # The test split is drawn first and alone, so it does not depend on train_size;
        # train then skips every test puzzle.
        exclude = set() if split == "test" else {_key(e) for e in self.examples("test")}
        rng = random.Random(f"countdown:{self.seed}:{split}")
        return [
            self.make_example(f"countdown-{split}-{i}", numbers, target, solution)
            for i, (numbers, target, solution) in enumerate(self._generate(rng, self.sizes[split], exclude))
        ]

    def _generate(self, rng: random.Random, count: int, exclude: set) -> list[tuple[list[int], int, str]]:
        puzzles, seen = [], set(exclude)
        attempts = 0
        while len(puzzles) < count:
            attempts += 1
            if attempts > 100 * count + 1000:
                raise ValueError(
                    f"could not generate {count} distinct solvable puzzles with this config "
                    f"(got {len(puzzles)}); widen the number or target ranges"
                )
            size = rng.randint(self.min_numbers, self.max_numbers)
            numbers = [rng.randint(self.min_number, self.max_number) for _ in range(size)]
            targets = _target_exprs(numbers, self.min_target, self.max_target)
            if not targets:
                continue
            target = rng.choice(sorted(targets))
            key = (tuple(sorted(numbers)), target)
            if key in seen:
                continue
            solution = render(targets[target])
            if not check_answer(solution, numbers, target)[0]:  # exact re-check of the float search
                solution = solve(numbers, target)
                if solution is None:
                    continue
            seen.add(key)
            puzzles.append((numbers, target, solution))
        return puzzles

    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        field = "numbers" if "numbers" in row or "nums" not in row else "nums"
        numbers = require(row, field, list)
        # Answers cannot write negative numbers (no unary minus) nor literals above MAX_LITERAL.
        if not numbers or not all(type(x) is int and 0 <= x <= MAX_LITERAL for x in numbers):
            raise FieldError(field, f"expected a non-empty list of ints in 0..{MAX_LITERAL}, got {numbers!r:.80}")
        target = _parse_target(row)
        solution = row.get("solution")
        ex_id = str(row["id"]) if row.get("id") is not None else str(index)
        return self.make_example(ex_id, numbers, target, solution if isinstance(solution, str) else None)

    # ----- reward -----
    def good_reply(self, example: Example) -> str | None:
        """The generated puzzles' kept solution as a closed think and answer (None without one)."""
        solution = example.meta.get("solution")
        return f"</think>\n<answer>{solution}</answer>" if solution else None

    def score_completion(self, completion: str, example: Example) -> Score:
        opening = example.opening  # the format is checked from its <think> on (all of it without one)
        fmt = format_reward(completion, opening[:opening.rfind("<think>")] if "<think>" in opening else opening)
        answer_text = extract_answer(completion)
        correct, error = False, None
        if answer_text is not None:
            correct, error = check_answer(answer_text, example.answer["numbers"], example.answer["target"])
        answer = 1.0 if correct else 0.0
        return Score(0.1 * fmt + answer, correct, {"format": fmt, "answer": answer}, error)


def _key(example: Example) -> tuple[tuple[int, ...], Any]:
    return tuple(sorted(example.answer["numbers"])), example.answer["target"]


def _parse_target(row: Mapping[str, Any]) -> int | float:
    """The row's target as an int when integral, else a float (strings like "98" accepted)."""
    raw = require(row, "target", (int, float, str))
    try:
        value = Fraction(raw.strip()) if isinstance(raw, str) else Fraction(raw)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise FieldError("target", f"expected a number, got {raw!r:.60}") from None
    if value.denominator == 1:
        return int(value)
    try:
        target = float(value)
    except OverflowError:
        target = math.inf
    if not math.isfinite(target):
        raise FieldError("target", f"expected a finite number, got {raw!r:.60}")
    return target


register("Countdown-v0", CountdownEnv)
