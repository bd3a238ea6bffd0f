"""Sudoku-v0: puzzle generation, the paper's partial-credit reward (checked against reasoning-gym's
own scorer), the strict ``correct`` verifier, the binary reward option, and users' data files."""

import json
import random

import gymnasium as gym
import pytest
import reasoning_gym
from gymnasium.utils.env_checker import check_env

import llm_envs.envs.sudoku  # noqa: F401  (registers Sudoku-v0)
from llm_envs.data import DataError
from llm_envs.envs.sudoku import OPENING, SudokuEnv, format_grid, parse_answer
from llm_envs.parsing import last_tag
from reasoning_gym.utils import extract_answer

# A puzzle with two solutions: only the 2s and 3s of rows 0-1 are open, and they can swap.
MULTI_PUZZLE = "1 _ 4 _\n4 _ 1 _\n3 1 2 4\n2 4 3 1"
MULTI_SOLUTION = "1 2 4 3\n4 3 1 2\n3 1 2 4\n2 4 3 1"
OTHER_SOLUTION = "1 3 4 2\n4 2 1 3\n3 1 2 4\n2 4 3 1"
VALID = "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1"
# A puzzle from reasoning-gym's generator, which keeps it to one solution.
UNIQUE_PUZZLE = "_ _ _ 2\n1 _ _ _\n_ _ 3 _\n_ 4 _ _"
UNIQUE_SOLUTION = "4 3 1 2\n1 2 4 3\n2 1 3 4\n3 4 2 1"


@pytest.fixture(scope="module")
def env():
    return gym.make("Sudoku-v0").unwrapped


@pytest.fixture(scope="module")
def binary_env():
    return gym.make("Sudoku-v0", reward="binary").unwrapped


@pytest.fixture(scope="module")
def user_puzzles(tmp_path_factory):
    """A data file of three user puzzles: MULTI_PUZZLE (two solutions), an empty grid, UNIQUE_PUZZLE."""
    path = tmp_path_factory.mktemp("sudoku") / "user.jsonl"
    rows = [{"puzzle": MULTI_PUZZLE, "solution": MULTI_SOLUTION}, {"puzzle": "_" * 16, "solution": VALID},
            {"puzzle": UNIQUE_PUZZLE, "solution": UNIQUE_SOLUTION}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.fixture(scope="module")
def user_env(user_puzzles):
    return SudokuEnv(data={"test": user_puzzles})


@pytest.fixture(scope="module")
def rg_score():
    """reasoning-gym's own mini_sudoku scorer on a completion: its extract_answer, then score_answer
    with the given solution as the entry (what the paper trained with)."""
    score_answer = reasoning_gym.get_score_answer_fn("mini_sudoku")

    def score(completion: str, solution_text: str) -> float:
        solution = [[int(c) for c in row.split()] for row in solution_text.splitlines()]
        return score_answer(extract_answer(completion), {"answer": solution_text, "metadata": {"solution": solution}})

    return score


def answer(grid_text: str, think: str = "reasoning") -> str:
    return f"<think>{think}</think>\n<answer>\n{grid_text}\n</answer>"


def puzzles(examples):
    return [format_grid(e.meta["puzzle"]) for e in examples]


def test_splits_unique_disjoint_and_seeded(env):
    train, test = env.examples("train"), env.examples("test")
    assert (len(train), len(test)) == (800, 200)
    assert len(set(puzzles(train)) | set(puzzles(test))) == 1000
    assert puzzles(SudokuEnv(seed=0).examples("test")) == puzzles(test)
    other = SudokuEnv(seed=1)
    assert len(set(puzzles(other.examples("test"))) & set(puzzles(test))) < 20
    # The test set does not move when the training set is resized.
    assert puzzles(SudokuEnv(train_size=10).examples("test")) == puzzles(test)
    assert len({e.id for e in train + test}) == 1000


def test_prompt_is_the_papers(env):
    ex = env.examples("test")[0]
    system, user, opening = ex.prompt
    assert opening == {"role": "assistant", "content": "Let me solve this step by step.\n<think>"}
    assert ex.opening == OPENING and SudokuEnv(opening=False).examples("test")[0].prompt == [system, user]
    assert system["role"] == "system" and system["content"].startswith("You are a helpful assistant.")
    assert user["content"].startswith("In 4x4 Mini Sudoku:\n- Each row must contain")
    grid = format_grid(ex.meta["puzzle"])
    assert f"puzzle:\n\n{grid}\n\nShow your work in <think> </think> tags." in user["content"]
    assert user["content"].endswith("For example <answer>\n2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4\n</answer>.")


# ----- the paper's reward: reasoning-gym's partial credit ------------------------------------------
def test_golden_solutions_score_one(env):
    for ex in env.examples("test")[:50] + env.examples("train")[:50]:
        assert "_" in format_grid(ex.meta["puzzle"])
        score = env.score(answer(ex.answer), ex)
        assert (score.reward, score.correct, score.error) == (1.0, True, None)
        assert score.parts == {"cells": 1.0, "layout": 1.0, "length": 1.0,
                               "answer": 1.0, "format": 1.0, "givens": 1.0, "units": 1.0}


@pytest.mark.parametrize(
    "block, expected, correct",
    [
        ("4 3 1 2\n1 2 4 3\n2 1 3 4\n3 4 2 1", 1.0, True),  # the solution, laid out as the prompt asks
        ("4 3 1 2  \n1 2 4 3\n2 1 3 4\n3 4 2 1", 31 / 33, True),  # trailing spaces: same layout, longer
        ("4,3,1,2\n1,2,4,3\n2,1,3,4\n3,4,2,1", 0.9, True),  # right cells, another layout
        ("4312\n1243\n2134\n3421", 0.9, True),
        ("[4, 3, 1, 2]\n[1, 2, 4, 3]\n[2, 1, 3, 4]\n[3, 4, 2, 1]", 0.9 * 31 / 51, True),
        ("4 3 1 2\n\n1 2 4 3\n\n2 1 3 4\n\n3 4 2 1", 0.9 * 31 / 34, True),  # blank lines are skipped
        ("4 3 1 2\n1 2 4 3\n2 1 3 4\n3 4 2 1\nDone.", 0.9 * 31 / 37, False),
        ("4 3 1 2\n1 2 4 3\n2 1 3 4\n3 4 2 1\n1 2 3 4", 0.9 * 31 / 39, False),  # a fifth row is not read
        ("3 4 1 2\n1 2 4 3\n2 1 3 4\n3 4 2 1", 0.9 * 14 / 16, False),  # two cells wrong (not a valid grid)
        ("4 3 1 2\n1 2 4 3\n2 1 3 4", 0.9 * 12 / 16, False),  # three rows
        ("4 3 _ 2\n1 2 4 3\n2 1 3 4\n3 4 2 1", 0.0, False),  # row 1 has 3 digits: rows 2-4 are read as 1-3
        ("Row 1: 4 3 1 2\nRow 2: 1 2 4 3\nRow 3: 2 1 3 4\nRow 4: 3 4 2 1", 0.0, False),  # five digits a line
        ("", 0.0, False),
    ],
)
def test_partial_credit_on_hand_made_answers(user_env, binary_env, rg_score, block, expected, correct):
    ex = user_env.examples("test")[2]
    assert ex.answer == UNIQUE_SOLUTION
    completion = f"<think>Fill the blanks.</think>\n<answer>\n{block}\n</answer>"
    score = user_env.score(completion, ex)
    assert score.reward == pytest.approx(expected, abs=1e-12)
    assert score.reward == rg_score(completion, UNIQUE_SOLUTION)  # reasoning-gym's own, to the bit
    assert score.reward == score.parts["cells"] * score.parts["layout"] * score.parts["length"]
    # `correct` stays the strict check; the binary option pays exactly that.
    assert score.correct == correct
    assert binary_env.score(completion, ex).reward == float(score.correct)


def test_no_answer_block_scores_zero(env):
    ex = env.examples("test")[0]
    for completion in ["no tags: " + ex.answer, "<answer>" + ex.answer, "</answer>" + ex.answer + "<answer>"]:
        score = env.score(completion, ex)
        assert (score.reward, score.correct, score.error) == (0.0, False, None)
        assert score.parts["cells"] == 0.0 and score.parts["format"] == 0.0


def random_block(rng: random.Random, solution: str, puzzle: str) -> str:
    """An answer block of a random kind: the solution, a mutated or random grid, or the puzzle, in
    a random layout, with rows dropped or added, digits 0-9, stray text and padding."""
    kind = rng.random()
    if kind < 0.3:
        rows = [row.split() for row in solution.splitlines()]
    elif kind < 0.6:
        rows = [row.split() for row in solution.splitlines()]
        for _ in range(rng.randint(1, 6)):
            rows[rng.randrange(4)][rng.randrange(4)] = rng.choice("0123456789")
    elif kind < 0.8:
        rows = [[rng.choice("1234") for _ in range(4)] for _ in range(4)]
    else:
        rows = [row.split() for row in puzzle.splitlines()]
    if rng.random() < 0.2:
        del rows[rng.randrange(len(rows))]
    if rng.random() < 0.2:
        rows.insert(rng.randrange(len(rows) + 1), [rng.choice("123456789") for _ in range(rng.randint(3, 5))])
    sep = rng.choice([" ", " ", ",", ", ", "", "\t", " | ", "  "])
    lines = [sep.join(row) for row in rows]
    style = rng.random()
    if style < 0.15:
        lines = [f"[{line}]" for line in lines]
    elif style < 0.25:
        lines = [f"Row {i + 1}: {line}" for i, line in enumerate(lines)]
    elif style < 0.35:
        lines = [line + " " * rng.randint(1, 3) for line in lines]
    elif style < 0.45:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(["", "---+---", "so:", "x 1", "12"]))
    text = rng.choice(["\n", "\n", "\r\n", "\n\n"]).join(lines)
    if rng.random() < 0.15:
        text = rng.choice(["The grid is:\n", "```\n", " "]) + text + rng.choice(["\nDone.", "\n```", "  "])
    return text


def test_partial_credit_equals_reasoning_gym_on_many_answers(env, rg_score):
    rng = random.Random(0)
    rewards = []
    for i in range(3000):
        ex = env.examples("test")[i % 50]
        block = random_block(rng, ex.answer, format_grid(ex.meta["puzzle"]))
        completion = rng.choice(["<think>t</think>\n<answer>\n{}\n</answer>", "<answer>{}</answer>",
                                 "<answer>1 2 3 4</answer> then <answer>\n{}\n</answer>", "{}"]).format(block)
        assert last_tag(completion, "answer") == extract_answer(completion)
        score = env.score(completion, ex)
        assert score.reward == rg_score(completion, ex.answer), completion
        rewards.append(score.reward)
    # The answers span the scorer's cases: exact, relaid out, partly right, nothing right.
    assert {0.0, 0.9, 1.0} <= set(rewards) and len(set(rewards)) > 50


def test_format_example_from_prompt_never_solves(env):
    example = "2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4"
    scores = [env.score(answer(example), ex) for ex in env.examples("test")]
    assert not any(s.correct for s in scores) and max(s.reward for s in scores) < 0.9


def test_alternative_valid_solution_scores_one(user_env, binary_env, rg_score):
    ex = user_env.examples("test")[0]
    assert ex.answer == MULTI_SOLUTION
    for solution in (MULTI_SOLUTION, OTHER_SOLUTION):
        score = user_env.score(answer(solution), ex)
        assert (score.reward, score.correct) == (1.0, True)
        assert binary_env.score(answer(solution), ex).reward == 1.0
        commas = user_env.score(answer(solution.replace(" ", ",")), ex)
        assert (commas.reward, commas.correct) == (0.9, True)
    # reasoning-gym alone would pay the other solution only for its cells equal to the stored one.
    assert rg_score(answer(OTHER_SOLUTION), MULTI_SOLUTION) == pytest.approx(0.9 * 12 / 16)
    # An invalid grid is still measured against the stored solution.
    near = OTHER_SOLUTION.replace("1 3 4 2", "1 2 4 2")
    assert user_env.score(answer(near), ex).reward == rg_score(answer(near), MULTI_SOLUTION)
    assert rg_score(answer(near), MULTI_SOLUTION) == pytest.approx(0.9 * 13 / 16)


# ----- options ----------------------------------------------------------------------------------
def test_binary_reward_option(binary_env, env):
    assert (binary_env.reward, env.reward) == ("binary", "partial")
    ex = env.examples("test")[0]
    rows = ex.answer.splitlines()
    wrong = "\n".join([rows[0][::-1], *rows[1:]])  # row 1 reversed: 12 of 16 cells right
    for completion in [answer(ex.answer), answer(ex.answer.replace(" ", ",")), answer(wrong), "none"]:
        partial, binary = env.score(completion, ex), binary_env.score(completion, ex)
        assert binary.reward == (1.0 if partial.correct else 0.0)
        assert (binary.correct, binary.parts) == (partial.correct, partial.parts)
    assert [binary_env.score(c, ex).reward for c in [answer(ex.answer), answer(wrong)]] == [1.0, 0.0]
    assert env.score(answer(wrong), ex).reward == pytest.approx(0.9 * 12 / 16)


def test_bad_reward_option():
    with pytest.raises(ValueError, match=r"^reward must be one of \('partial', 'binary'\), got 'cells'$"):
        gym.make("Sudoku-v0", reward="cells")


# ----- the strict check: `correct` ----------------------------------------------------------------
@pytest.fixture()
def solved(env):
    ex = env.examples("test")[3]
    return ex, [list(r) for r in ex.meta["solution"]]


def as_text(grid):
    return "\n".join(" ".join(map(str, row)) for row in grid)


def test_changed_given_fails(env, binary_env, solved):
    ex, grid = solved
    # Relabel a given digit everywhere: still a valid sudoku, but a given changes.
    a = next(x for row in ex.meta["puzzle"] for x in row if x)
    b = a % 4 + 1
    swapped = [[b if x == a else a if x == b else x for x in row] for row in grid]
    score = env.score(answer(as_text(swapped)), ex)
    assert not score.correct and score.reward == pytest.approx(0.9 * 8 / 16)  # the cells holding neither a nor b
    assert score.parts["givens"] == 0.0 and score.parts["units"] == 1.0
    assert binary_env.score(answer(as_text(swapped)), ex).reward == 0.0


@pytest.mark.parametrize(
    "grid, units_ok, cells_ok",
    [
        ("1 1 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1", 9, 15),  # row 0 repeats (so do column 1 and a box)
        ("1 2 3 4\n3 4 1 2\n1 2 4 3\n4 3 2 1", 10, 14),  # only columns 0 and 1 repeat
        ("1 2 3 4\n2 3 4 1\n3 4 1 2\n4 1 2 3", 8, 6),  # only the boxes repeat (a Latin square)
    ],
)
def test_duplicates_fail(user_env, grid, units_ok, cells_ok):
    ex = user_env.examples("test")[1]  # empty puzzle: only the grid's own validity matters
    assert user_env.score(answer(VALID), ex).correct
    score = user_env.score(answer(grid), ex)
    assert score.parts["format"] == 1.0 and score.parts["givens"] == 1.0
    assert not score.correct and score.parts["units"] == units_ok / 12
    assert score.reward == pytest.approx(0.9 * cells_ok / 16)  # partial credit against the stored solution, VALID


@pytest.mark.parametrize(
    "completion",
    [
        "no tags at all\n1 2 3 4",
        "<answer>\n1 2 4\n4 3 1\n3 1 2\n</answer>",  # 3x3
        "<answer>\n1 2 4 3\n4 3 1 2\n3 1 2 4\n</answer>",  # 3 rows
        "<answer>\n1 2 4 3\n4 3 1 2\n3 1 2 4\n2 4 3 1\n2 4 3 1\n</answer>",  # 5 rows
        "<answer>\n1 2 4 3 1\n4 3 1 2\n3 1 2 4\n2 4 3 1\n</answer>",  # 5 cells
        "<answer>\n1 2 4 a\n4 3 1 2\n3 1 2 4\n2 4 3 1\n</answer>",  # non-digit
        "<answer>\nRow 1: 1 2 4 3\n4 3 1 2\n3 1 2 4\n2 4 3 1\n</answer>",  # stray text
        "<answer>\n1 2 4 3\n4 3 1 2\n3 1 2 4\n2 4 3 1",  # unclosed
        "<answer></answer>",
    ],
)
def test_malformed_answers_fail(user_puzzles, completion):
    binary = SudokuEnv(data={"test": user_puzzles}, reward="binary")
    score = binary.score(completion, binary.examples("test")[0])
    assert (score.reward, score.correct, score.error) == (0.0, False, None)
    assert score.parts["format"] == 0.0


def test_out_of_range_digits_fail(env, solved):
    ex, grid = solved
    grid[0][0] = 5
    score = env.score(answer(as_text(grid)), ex)
    assert score.parts["format"] == 1.0 and not score.correct
    assert score.reward == pytest.approx(0.9 * 15 / 16)


def test_lenient_layout(env, binary_env, solved):
    ex, grid = solved
    rows = [" ".join(map(str, r)) for r in grid]
    variants = [
        "\n\n" + "\n\n".join(rows) + "\n\n",  # blank lines
        "\n".join("  " + r.replace(" ", "\t") + "  " for r in rows),  # tabs, indentation
        "\n".join(",".join(map(str, r)) for r in grid),  # commas
        "\n".join(str(r) for r in grid),  # Python lists
        "\n".join("".join(map(str, r)) for r in grid),  # no separators
        "```\n" + "\n".join(rows[:2]) + "\n---+---\n" + "\n".join(rows[2:]) + "\n```",  # decorated
    ]
    for text in variants:
        completion = f"<answer>{text}</answer>"
        assert env.score(completion, ex).correct and binary_env.score(completion, ex).reward == 1.0, text
        assert 0.5 < env.score(completion, ex).reward <= 0.9  # the paper's reward wants its layout


def test_only_last_answer_block_counts(env, solved):
    ex, grid = solved
    wrong = [row[:] for row in grid]
    wrong[0][0], wrong[0][1] = wrong[0][1], wrong[0][0]
    assert env.score(answer(as_text(wrong)) + answer(ex.answer), ex).reward == 1.0
    last_wrong = env.score(answer(ex.answer) + answer(as_text(wrong)), ex)
    assert not last_wrong.correct and last_wrong.reward == pytest.approx(0.9 * 14 / 16)
    assert env.score(answer(ex.answer) + "<answer>see above</answer>", ex).reward == 0.0


def test_score_never_raises(env, solved):
    ex, _ = solved
    assert env.score(None, ex).reward == 0.0  # type: ignore[arg-type]
    assert env.score("<answer>\u0661\u0662\u0663\u0664\n" * 4 + "</answer>", ex).reward == 0.0
    broken = type(ex)(id="x", prompt=ex.prompt, answer=ex.answer, meta={})
    score = env.score(answer(ex.answer), broken)
    assert score.reward == 0.0 and score.error


def test_check_env_and_episode(env):
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=1, options={"split": "test", "index": 0})
    ex = env.examples("test")[0]
    assert format_grid(ex.meta["puzzle"]) in obs
    _, reward, terminated, truncated, info = env.step(answer(ex.answer))
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)


@pytest.mark.parametrize(
    "puzzle, solution",
    [
        (MULTI_PUZZLE, MULTI_SOLUTION),  # 4 row string with spaces
        (MULTI_PUZZLE.replace("\n", "").replace(" ", ""), MULTI_SOLUTION.replace("_", "")),  # 16 chars
        (MULTI_PUZZLE.replace("_", "0").splitlines(), MULTI_SOLUTION.splitlines()),  # list of row strings
        ([[int(c) if c != "_" else 0 for c in r.split()] for r in MULTI_PUZZLE.splitlines()],
         [[int(c) for c in r.split()] for r in MULTI_SOLUTION.splitlines()]),  # list of int lists
        ([c for c in MULTI_PUZZLE.split()], [int(c) for c in MULTI_SOLUTION.split()]),  # flat lists
        ("1.4.\n4.1.\n3124\n2431", "1243|4312|3124|2431"),  # dots and bars
    ],
)
def test_data_formats(tmp_path, puzzle, solution):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"id": "mine", "puzzle": puzzle, "solution": solution}]))
    env = SudokuEnv(data={"train": path})
    (ex,) = env.examples("train")
    assert ex.id == "mine"
    assert format_grid(ex.meta["puzzle"]) == MULTI_PUZZLE
    assert ex.answer == MULTI_SOLUTION
    assert ex.meta["num_empty"] == 4
    assert env.score(answer(OTHER_SOLUTION), ex).correct


@pytest.mark.parametrize(
    "row, field",
    [
        ({"solution": MULTI_SOLUTION}, "puzzle"),
        ({"puzzle": MULTI_PUZZLE}, "solution"),
        ({"puzzle": 1234, "solution": MULTI_SOLUTION}, "puzzle"),
        ({"puzzle": "1 _ 4", "solution": MULTI_SOLUTION}, "puzzle"),  # too few cells
        ({"puzzle": MULTI_PUZZLE.replace("1", "5", 1), "solution": MULTI_SOLUTION}, "puzzle"),
        ({"puzzle": [[1, 2, 3]] * 4, "solution": MULTI_SOLUTION}, "puzzle"),
        ({"puzzle": MULTI_PUZZLE, "solution": MULTI_SOLUTION.replace("2", "_", 1)}, "solution"),  # blank
        ({"puzzle": MULTI_PUZZLE, "solution": "1 2 4 3\n4 3 1 2\n3 1 2 4\n2 4 1 3"}, "solution"),  # given
        ({"puzzle": "_" * 16, "solution": "1 2 3 4\n1 2 3 4\n1 2 3 4\n1 2 3 4"}, "solution"),  # invalid
    ],
)
def test_malformed_rows_name_file_row_field(tmp_path, row, field):
    path = tmp_path / "bad.jsonl"
    good = {"puzzle": MULTI_PUZZLE, "solution": MULTI_SOLUTION}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as info:
        SudokuEnv(data={"train": path}).examples("train")
    message = str(info.value)
    assert str(path) in message and "row 1" in message and f"field {field!r}" in message


def test_parse_answer_unit():
    assert parse_answer(VALID) == [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
    assert parse_answer("1 2 3 4 3 4 1 2 2 1 4 3 4 3 2 1") is None  # rows must be on lines


def test_score_batch_matches_score(env):
    examples = list(env.examples("test")[:40])
    completions = [answer(e.answer) if i % 3 else answer("1 2 3 4\n" * 4) for i, e in enumerate(examples)]
    completions[5] = "garbage"
    expected = [env.score(c, e) for c, e in zip(completions, examples)]
    try:
        assert env.score_batch(completions, examples, workers=2) == expected
    finally:
        env.close()
    assert [s.reward for s in expected].count(1.0) == 25
