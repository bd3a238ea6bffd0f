"""The main environments' rewards against the paper's reward functions (docs/PAPER_NOTES.md, written
out below as references), on generated corpora of completions: the right answer inside and outside
the tags, closed, unclosed, repeated, nested and empty blocks, text cut mid-block, whitespace and
unicode. Every case equals the reference, except the deliberate differences docs/environments.md
lists ("Where the rewards differ from the paper's"), whose documented behaviour is tested here."""

from __future__ import annotations

import re

import pytest

import llm_envs
from llm_envs import scoring

_THINK = "I try the numbers one by one."


def paper_countdown(turn_from_think: str, numbers: list[int], target: float) -> float:
    """The paper's Countdown reward (TinyZero's rule): 0.1 x format + answer, on ``"<think>" +
    completion``. Evaluates only this test's own generated text, whose characters it checks first."""
    text = turn_from_think.strip()
    if re.match(r"^<think>.*?</think>\n<answer>.*?</answer>$", text, re.DOTALL):
        fmt = 1.0
    else:
        fmt = 0.1 * bool(re.search(r"<think>.*?</think>", text, re.DOTALL)) + \
            0.5 * bool(re.search(r"<answer>.*?</answer>", text, re.DOTALL))
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    answer = 0.0
    if blocks:
        eq = blocks[-1].strip()
        used = [int(n) for n in re.findall(r"\d+", eq)]
        if re.fullmatch(r"[\d+\-*/().\s]+", eq) and "**" not in eq and sorted(used) == sorted(numbers):
            try:
                value = eval(eq, {"__builtins__": None}, {})  # noqa: S307 - this test's own digits-and-operators text
            except (SyntaxError, ZeroDivisionError, TypeError):
                value = None
            answer = float(value is not None and abs(value - target) < 1e-5)
    return 0.1 * fmt + answer


def countdown_corpus(solution: str, numbers: list[int], target) -> list[tuple[str, str | None]]:
    """(completion, deviation or None): what continues the opening "...\\n<think>"."""
    wrong = solution.replace(str(numbers[0]), str(numbers[0] + 1), 1)
    full = f"{_THINK}</think>\n<answer>{solution}</answer>"
    start = full.index("<answer>")
    cases = [full, full + "\n", f"  {full}  ", full + " and that is it", f"{_THINK}</think> <answer>{solution}</answer>",
             f"{_THINK}</think>\n\n<answer>{solution}</answer>", f"<answer>{solution}</answer>",
             f"{_THINK}</think>\n<answer>{wrong}</answer><answer>{solution}</answer>",
             f"{_THINK}</think>\n<answer>{solution}</answer>\n<answer>{wrong}</answer>",
             f"{_THINK}</think>\n<answer>{solution}", f"{_THINK}</think>\n<answer><answer>{solution}</answer></answer>",
             f"{_THINK}</think>\n<answer></answer>", f"{_THINK}</think>\n<answer>\n  {solution}\t\n</answer>",
             f"{_THINK}</think>\n<answer>{solution.replace(' ', '')}</answer>",
             f"{_THINK}</think>\n<answer>(({solution}))</answer>", f"{_THINK}</think>\n<answer>{wrong}</answer>",
             f"{_THINK}</think>\n<answer>{solution} + {numbers[0]} - {numbers[0]}</answer>",
             f"{_THINK}</think>\n<answer>{solution.replace(str(numbers[0]), f'{numbers[0]}.0', 1)}</answer>",
             f"{_THINK} {solution} = {target}</think>", f"The answer is {solution}.", "", "</think>\n<answer>",
             f"{_THINK}</think>\n<answer>{solution}\u00a0</answer>", f"{_THINK}</think>\n<answer>答 {solution}</answer>",
             *(full[:cut] for cut in (start + 3, start + 8, start + 8 + len(solution) // 2, len(full) - 4))]
    out = [(c, None) for c in cases]
    unicode = solution.replace("*", "×").replace("/", "÷").replace("-", "−")
    out += [(f"{_THINK}</think>\n<answer>{unicode}</answer>", "unicode operators" if unicode != solution else None),
            (f"{_THINK}</think>\n<answer>{solution} = {target}</answer>", "= target"),
            (f"{_THINK}</think>\n<answer>{'(' * 100}{solution}{')' * 100}</answer>", "over 200 characters"),
            (f"{_THINK}</think>\n<answer>-(-({solution}))</answer>", "unary minus")]
    return out


def test_countdown_equals_the_papers_reward_but_for_documented_differences():
    env = llm_envs.make("Countdown-v0", train_size=0, test_size=8)
    checked = 0
    for ex in env.examples("test"):
        numbers, target, solution = ex.answer["numbers"], ex.answer["target"], ex.meta["solution"]
        for completion, deviation in countdown_corpus(solution, numbers, target):
            score = scoring.checked_score(env, completion, ex)
            expected = paper_countdown("<think>" + completion, numbers, target)
            if deviation is None:
                assert score.reward == pytest.approx(expected, abs=1e-12), (completion, score, expected)
                checked += 1
            elif deviation in ("over 200 characters", "unary minus"):  # rejected (docs/environments.md)
                assert score.parts["answer"] == 0.0 and expected == pytest.approx(1.1), completion
            else:  # read as the paper's model means them: accepted where the paper's check is not
                assert score.parts["answer"] == 1.0 and expected < 1.0, (deviation, completion)
    assert checked >= 8 * 25


def test_conciseness_equals_the_papers_length_reward():
    """-|len(y) - len(s)| on the response; the env counts it stripped of surrounding whitespace
    (documented; strip=False is the paper's raw count), unicode by code point as Python's len."""
    raw = llm_envs.make("Conciseness-v0", strip=False)
    stripped = llm_envs.make("Conciseness-v0")
    for ex in raw.examples("test"):
        s = ex.answer
        for y in [s, f" {s}\n", f"{s}.", f"The answer is {s}.", "", "  ", "é" * len(s), f"{s}\u200b", "答案" + s,
                  s * 40, f"<answer>{s}</answer>", f"{s}\n\n\n"]:
            assert scoring.checked_score(raw, y, ex).reward == -abs(len(y) - len(s)), y
            assert scoring.checked_score(stripped, y, ex).reward == -abs(len(y.strip()) - len(s)), y


def test_sudoku_equals_reasoning_gyms_mini_sudoku_reward():
    """The paper trained Sudoku with reasoning-gym's mini_sudoku reward: score_answer(extract_answer(turn))."""
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    from llm_envs.envs.sudoku import format_grid

    score_answer = reasoning_gym.get_score_answer_fn("mini_sudoku")
    env = llm_envs.make("Sudoku-v0", train_size=0, test_size=6)
    for ex in env.examples("test"):
        solution = ex.meta["solution"]
        grid = format_grid(solution)
        rows = [[int(c) for c in row.split()] for row in grid.splitlines()]
        entry = {"answer": grid, "metadata": {"solution": rows}}
        half = grid[: len(grid) // 2]
        full = f"{_THINK}</think>\n<answer>\n{grid}\n</answer>"
        for completion in [full, f"<answer>{grid}</answer>", f"<answer>{grid}", f"<answer>{half}</answer>",
                           f"<answer>x</answer><answer>{grid}</answer>", f"<answer>{grid}</answer><answer>x</answer>",
                           f"<answer><answer>{grid}</answer></answer>", "<answer></answer>", "<answer>  </answer>",
                           f"<answer>{grid.replace(' ', '  ')}</answer>", f"<answer>{grid.replace(chr(10), ' ')}</answer>",
                           f"<answer>{grid.replace('1', '１')}</answer>", f"<answer>{grid}\u00a0</answer>", grid,
                           *(full[:cut] for cut in range(len(full) - 30, len(full), 7))]:
            expected = score_answer(extract_answer(ex.opening + completion), entry)
            assert scoring.checked_score(env, completion, ex).reward == pytest.approx(expected, abs=1e-12), completion


def paper_last_boxed(text: str) -> str | None:
    """The paper's "last \\boxed{} answer": the content of the last \\boxed{ whose braces close."""
    for start in reversed([m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]):
        depth, i = 1, start
        while i < len(text) and depth:
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start:i - 1].strip()
    return None


def test_math_equals_math_verify_on_the_last_boxed_answer(tmp_path):
    """MATH: 1 if the last \\boxed{} answer equals the reference by math-verify (no format reward)."""
    import json

    from math_verify import LatexExtractionConfig, parse, verify

    golds = ["204", "\\frac{1}{2}", "2\\sqrt{2}", "\\left( 3, \\frac{\\pi}{2} \\right)", "135^\\circ", "(-2, 2)"]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps({"problem": f"Problem {i}.", "answer": g}) + "\n" for i, g in enumerate(golds)))
    env = llm_envs.make("MATH-v0", data={"test": str(path)}, hub=False)

    def boxed(answer: str) -> list:
        return parse("\\boxed{" + answer + "}", [LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None)

    for ex in env.examples("test"):
        g = ex.answer
        full = f"So the answer is $\\boxed{{{g}}}$."
        for completion in [full, f"\\boxed{{7}} then {full}", f"{full} or maybe \\boxed{{7}}", f"\\boxed{{{g}",
                           f"{full} \\boxed{{", f"\\boxed{{\\boxed{{{g}}}}}", "\\boxed{}", f"\\boxed{{ {g} }}",
                           f"\\fbox{{{g}}}", f"\\boxed {{{g}}}", f"The answer is {g}.", "", f"\\boxed{{{g}}}\u00a0",
                           f"\\boxed{{答 {g}}}", *(full[:cut] for cut in range(len(full) - 6, len(full)))]:
            pred = paper_last_boxed(completion)
            expected = float(bool(pred) and bool(verify(boxed(g), boxed(pred), timeout_seconds=None)))
            score = scoring.checked_score(env, completion, ex)
            assert (score.reward, score.parts["boxed"]) == (expected, float(pred is not None)), (completion, pred)
    env.close()
