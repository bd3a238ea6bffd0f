"""Sudoku-v0: puzzle generation, the constraint verifier, and users' data files."""

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs.envs.sudoku  # noqa: F401  (registers Sudoku-v0)
from llm_envs.data import DataError
from llm_envs.envs.sudoku import SudokuEnv, format_grid, parse_answer

# A puzzle with two solutions: only the 2s and 3s of rows 0-1 are open, and they can swap.
MULTI_PUZZLE = "1 _ 4 _\n4 _ 1 _\n3 1 2 4\n2 4 3 1"
MULTI_SOLUTION = "1 2 4 3\n4 3 1 2\n3 1 2 4\n2 4 3 1"
OTHER_SOLUTION = "1 3 4 2\n4 2 1 3\n3 1 2 4\n2 4 3 1"
VALID = "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1"


@pytest.fixture(scope="module")
def env():
    return gym.make("Sudoku-v0").unwrapped


@pytest.fixture(scope="module")
def multi_env(tmp_path_factory):
    """An env on two user puzzles: MULTI_PUZZLE (two solutions) and an empty grid."""
    path = tmp_path_factory.mktemp("sudoku") / "multi.jsonl"
    rows = [{"puzzle": MULTI_PUZZLE, "solution": MULTI_SOLUTION}, {"puzzle": "_" * 16, "solution": VALID}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return SudokuEnv(data={"test": path})


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
    system, user = ex.prompt
    assert system["role"] == "system" and system["content"].startswith("You are a helpful assistant.")
    assert user["content"].startswith("In 4x4 Mini Sudoku:\n- Each row must contain")
    grid = format_grid(ex.meta["puzzle"])
    assert f"puzzle:\n\n{grid}\n\nShow your work in <think> </think> tags." in user["content"]
    assert user["content"].endswith("For example <answer>\n2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4\n</answer>.")


def test_golden_solutions_score_one(env):
    for ex in env.examples("test")[:50] + env.examples("train")[:50]:
        assert "_" in format_grid(ex.meta["puzzle"])
        score = env.score(answer(ex.answer), ex)
        assert (score.reward, score.correct, score.error) == (1.0, True, None)
        assert score.parts == {"answer": 1.0, "format": 1.0, "givens": 1.0, "units": 1.0}


def test_format_example_from_prompt_never_solves(env):
    example = "2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4"
    assert all(env.score(answer(example), ex).reward == 0.0 for ex in env.examples("test"))


def test_alternative_valid_solution_scores_one(multi_env):
    ex = multi_env.examples("test")[0]
    assert ex.answer == MULTI_SOLUTION
    assert multi_env.score(answer(MULTI_SOLUTION), ex).correct
    assert multi_env.score(answer(OTHER_SOLUTION), ex).reward == 1.0


@pytest.fixture()
def solved(env):
    ex = env.examples("test")[3]
    return ex, [list(r) for r in ex.meta["solution"]]


def as_text(grid):
    return "\n".join(" ".join(map(str, row)) for row in grid)


def test_changed_given_fails(env, solved):
    ex, grid = solved
    # Relabel a given digit everywhere: still a valid sudoku, but a given changes.
    a = next(x for row in ex.meta["puzzle"] for x in row if x)
    b = a % 4 + 1
    swapped = [[b if x == a else a if x == b else x for x in row] for row in grid]
    score = env.score(answer(as_text(swapped)), ex)
    assert score.reward == 0.0 and not score.correct
    assert score.parts["givens"] == 0.0 and score.parts["units"] == 1.0


@pytest.mark.parametrize(
    "grid, units_ok",
    [
        ("1 1 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1", 9),  # row 0 repeats (so do column 1 and a box)
        ("1 2 3 4\n3 4 1 2\n1 2 4 3\n4 3 2 1", 10),  # only columns 0 and 1 repeat
        ("1 2 3 4\n2 3 4 1\n3 4 1 2\n4 1 2 3", 8),  # only the boxes repeat (a Latin square)
    ],
)
def test_duplicates_fail(multi_env, grid, units_ok):
    ex = multi_env.examples("test")[1]  # empty puzzle: only the grid's own validity matters
    assert multi_env.score(answer(VALID), ex).reward == 1.0
    score = multi_env.score(answer(grid), ex)
    assert score.parts["format"] == 1.0 and score.parts["givens"] == 1.0
    assert score.reward == 0.0 and not score.correct and score.parts["units"] == units_ok / 12


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
def test_malformed_answers_fail(multi_env, completion):
    score = multi_env.score(completion, multi_env.examples("test")[0])
    assert (score.reward, score.correct, score.error) == (0.0, False, None)
    assert score.parts["format"] == 0.0


def test_out_of_range_digits_fail(env, solved):
    ex, grid = solved
    grid[0][0] = 5
    score = env.score(answer(as_text(grid)), ex)
    assert score.parts["format"] == 1.0 and score.reward == 0.0


def test_lenient_layout(env, solved):
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
        assert env.score(f"<answer>{text}</answer>", ex).reward == 1.0, text


def test_only_last_answer_block_counts(env, solved):
    ex, grid = solved
    wrong = [row[:] for row in grid]
    wrong[0][0], wrong[0][1] = wrong[0][1], wrong[0][0]
    assert env.score(answer(as_text(wrong)) + answer(ex.answer), ex).reward == 1.0
    assert env.score(answer(ex.answer) + answer(as_text(wrong)), ex).reward == 0.0
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
