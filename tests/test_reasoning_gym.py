"""rg/<task>-v0: every reasoning-gym task as an environment. Registration (cheap, complete), the
task's config as gym.make's keyword arguments (and one-line errors), disjoint seeded splits, the
paper's prompt and answer format, golden answers through the task's own scorer, time bounds in
worker processes (fresh ones included), check_env over every task, and ``python -m llm_envs.list``."""

import json
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_envs
from llm_envs import scoring
from llm_envs.envs import rg
from llm_envs.envs.rg import OPENING, SYSTEM_PROMPT, ReasoningGymEnv
from llm_envs.list import main as list_main
from llm_envs.parsing import final_answer, last_tag

#: The golden tasks: the brief's five, a list-of-words answer and a sympy-scored one.
GOLDEN = ["basic_arithmetic", "chain_sum", "leg_counting", "number_sorting", "gcd", "word_sorting",
          "polynomial_multiplication"]
ROOT = Path(__file__).resolve().parents[1]
TINY = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)  # basic_arithmetic: a few hundred questions


def make(task: str, **kwargs) -> ReasoningGymEnv:
    kwargs = {"train_size": 4, "test_size": 4, **kwargs}
    return gym.make(rg.env_id(task), **kwargs).unwrapped


def golden(answer: str, think: str = "x") -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


def questions(examples) -> list[str]:
    return [e.meta["question"] for e in examples]


@pytest.fixture
def forked(monkeypatch):
    """Scoring workers forked from this process (fast to start; they see monkeypatches)."""
    monkeypatch.setattr(scoring, "start_method", lambda: "fork")


# ----- registration ---------------------------------------------------------------------------------
def test_every_installed_task_is_registered():
    installed = sorted(rg.installed_tasks())
    assert list(rg.TASKS) == installed, (
        "reasoning-gym's tasks changed: set TASKS in llm_envs/envs/rg.py to "
        "sorted(reasoning_gym.factory.DATASETS)")
    assert llm_envs.RG_ENV_IDS == [f"rg/{t}-v0" for t in installed]
    for task in installed:
        spec = gym.registry[f"rg/{task}-v0"]
        assert spec.namespace == "rg" and spec.name == task and spec.entry_point is ReasoningGymEnv
        assert llm_envs.registry.env_class(spec.id) is ReasoningGymEnv
    assert not set(llm_envs.RG_ENV_IDS) & set(llm_envs.ENV_IDS)  # loops over the built-ins stay short


def test_import_does_not_import_reasoning_gym():
    code = "import sys, llm_envs; print(len(llm_envs.RG_ENV_IDS), 'reasoning_gym' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(len(rg.TASKS)), "False"], out.stderr


# ----- config and errors ---------------------------------------------------------------------------
def test_config_fields_reach_the_generator():
    env = make("basic_arithmetic", **TINY, operators=("+",), test_size=20)
    assert env.task_config == {**TINY, "operators": ("+",)}
    # The test split is exactly reasoning-gym's dataset at the split's seed.
    dataset = rg.installed_tasks()["basic_arithmetic"][0](
        rg.installed_tasks()["basic_arithmetic"][1](**TINY, operators=("+",), seed=env.split_seed("test"), size=20))
    assert questions(env.examples("test")) == [dataset[i]["question"] for i in range(20)]
    assert all(e.meta["metadata"]["expression"].count("+") == 1 for e in env.examples("test"))


def test_unknown_argument_is_one_line_naming_the_fields():
    with pytest.raises(TypeError) as info:
        gym.make("rg/basic_arithmetic-v0", min_term=2)
    message = str(info.value)
    assert "\n" not in message and "unknown argument 'min_term' for basic_arithmetic" in message
    assert "min_terms, max_terms, min_digits, max_digits" in message and "train_size" in message
    with pytest.raises(TypeError, match="'size' is the env's to set"):
        gym.make("rg/gcd-v0", size=10)
    with pytest.raises(TypeError, match="rg/gcd-v0: bad argument: unknown argument 'foo' for gcd"):
        llm_envs.make("rg/gcd-v0", foo=1)


def test_bad_config_value_is_one_line_naming_task_and_problem():
    with pytest.raises(ValueError) as info:
        gym.make("rg/basic_arithmetic-v0", min_terms=0)
    assert str(info.value) == "rg/basic_arithmetic-v0: invalid config: min_terms must be positive"
    assert info.value.__suppress_context__  # not chained to reasoning-gym's assertion
    with pytest.raises(ValueError, match=r"^rg/gcd-v0: invalid config: .+$"):
        gym.make("rg/gcd-v0", min_numbers=5, max_numbers=2)
    with pytest.raises(ValueError, match="test_size must be an int"):
        gym.make("rg/gcd-v0", test_size=-1)


def test_task_missing_from_installed_reasoning_gym():
    with pytest.raises(ValueError, match=r"rg/no_such_task-v0: reasoning-gym \S+ has no task 'no_such_task'"):
        ReasoningGymEnv("no_such_task")


# ----- splits ------------------------------------------------------------------------------------------
def test_split_seeds_never_overlap():
    for seed in range(100):
        env = ReasoningGymEnv("chain_sum", seed=seed, train_size=rg.MAX_SPLIT, test_size=rg.MAX_SPLIT)
        test, train = env.split_seed("test"), env.split_seed("train")
        # Item i of a split uses seed split_seed + i: the ranges lie in different halves of 32 bits.
        assert 0 <= test and test + rg.MAX_SPLIT + rg._SEED_MARGIN <= 2**31 <= train
        assert train + rg.MAX_SPLIT + rg._SEED_MARGIN <= 2**32
    small = ReasoningGymEnv("chain_sum", seed=0)
    assert small.split_seed("test") != ReasoningGymEnv("chain_sum", seed=1).split_seed("test")


def test_splits_sized_seeded_and_disjoint():
    env = make("chain_sum", train_size=30, test_size=10)
    train, test = env.examples("train"), env.examples("test")
    assert (len(train), len(test)) == (30, 10) and env.dropped_from_train == 0
    assert not set(questions(train)) & set(questions(test))
    assert len({e.id for e in train + test}) == 40
    same = make("chain_sum", train_size=30, test_size=10)
    assert [(e.prompt, e.answer) for e in same.examples("train")] == [(e.prompt, e.answer) for e in train]
    assert questions(same.examples("test")) == questions(test)
    other = make("chain_sum", train_size=30, test_size=10, seed=1)
    assert questions(other.examples("test")) != questions(test)
    # The test split does not move with train_size, and a smaller one is a prefix of a larger one.
    assert questions(make("chain_sum", train_size=3, test_size=10).examples("test")) == questions(test)
    assert questions(make("chain_sum", train_size=3, test_size=4).examples("test")) == questions(test)[:4]


def test_train_drops_questions_of_test():
    # 2 one-digit terms and + or -: few enough questions that 300 draws repeat test ones.
    env = make("basic_arithmetic", **TINY, operators=("+", "-"), train_size=300, test_size=50)
    train, test = env.examples("train"), env.examples("test")
    assert len(test) == 50 and env.dropped_from_train > 0 and len(train) == 300 - env.dropped_from_train
    assert not set(questions(train)) & set(questions(test))
    # What is left is the generated train split in order, ids kept.
    dataset_cls, config_cls = rg.installed_tasks()["basic_arithmetic"]
    generated = dataset_cls(config_cls(**TINY, operators=("+", "-"), seed=env.split_seed("train"), size=300))
    kept = [(f"basic_arithmetic-train-{i}", generated[i]["question"]) for i in range(300)
            if generated[i]["question"] not in set(questions(test))]
    assert [(e.id, e.meta["question"]) for e in train] == kept


def test_users_test_file_and_train_skips_it(tmp_path, forked):
    source = make("basic_arithmetic", **TINY, train_size=5, test_size=0)
    rows = [{"id": f"mine-{i}", **rg.entry(e)} for i, e in enumerate(source.examples("train")[:3])]
    path = tmp_path / "test.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make("basic_arithmetic", **TINY, train_size=5, test_size=0, data={"test": path})
    train, test = env.examples("train"), env.examples("test")
    assert [e.id for e in test] == ["mine-0", "mine-1", "mine-2"] and env.dropped_from_train >= 3
    assert not set(questions(train)) & set(questions(test))
    assert [s.reward for s in env.score_batch([golden(e.answer) for e in test], test, workers=1)] == [1.0] * 3
    env.close()
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "metadata": [1]}))
    with pytest.raises(llm_envs.DataError, match="row 0: field 'metadata'"):
        make("gcd", data={"test": tmp_path / "bad.jsonl"}).examples("test")


# ----- prompt --------------------------------------------------------------------------------------------
def test_prompt_is_the_papers_format():
    env = make("gcd")
    ex = env.examples("test")[0]
    system, user, opening = ex.prompt
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert SYSTEM_PROMPT.startswith("You are a helpful assistant. You first think about the reasoning process")
    assert "<think> </think>" in SYSTEM_PROMPT and "<answer> </answer>" in SYSTEM_PROMPT
    assert user == {"role": "user", "content": ex.meta["question"]} and "GCD" in user["content"]
    assert opening == {"role": "assistant", "content": "Let me solve this step by step.\n<think>"} == {
        "role": "assistant", "content": OPENING}
    assert make("gcd", opening=False).examples("test")[0].prompt == [system, user]
    assert make("gcd", opening="Answer: ").examples("test")[0].opening == "Answer: "
    assert make("gcd", system_prompt=None).examples("test")[0].prompt[0] == user
    assert ex.meta["task"] == "gcd" and rg.entry(ex) == {"question": user["content"], "answer": ex.answer,
                                                         "metadata": ex.meta["metadata"]}


# ----- reward: golden answers through the task's own scorer --------------------------------------------
@pytest.mark.parametrize("task", GOLDEN)
def test_golden_answers(task, forked):
    env = make(task, train_size=0, test_size=5)
    examples = list(env.examples("test"))
    cases = []  # (completion, example, expected reward or None for "< 1")
    for ex in examples:
        right = ex.answer
        assert isinstance(right, str) and right
        cases += [
            (golden(right), ex, 1.0),
            (golden(f"{right} is my answer, or maybe not"), ex, None),
            (golden("wrong"), ex, None),
            (f"I think it is {right}.", ex, 0.0),  # no answer block
            (golden("wrong") + f"\nNo wait.\n<answer> {right} </answer>", ex, 1.0),  # the last one counts
            (golden(right) + "\n<answer>wrong</answer>", ex, None),
            (f"<think>x</think>\n<answer> {right} ", ex, 0.0),  # never closed: no answer, as in reasoning-gym
            (golden("wrong") + f"\n<answer>{right}", ex, None),  # a closed block beats a later open one
            (golden(right) + "\nMore text.\n<answer>", ex, 1.0),  # so an empty open tail does not hide it
        ]
    scores = env.score_batch([c for c, _, _ in cases], [e for _, e, _ in cases], workers=1)
    for (completion, ex, expected), score in zip(cases, scores):
        assert score.error is None, (completion, score)
        if expected is None:
            assert score.reward < 1.0 and not score.correct, (completion, ex.answer, score)
        else:
            assert score.reward == expected and score.correct == (expected == 1.0), (completion, score)
            closed = 1.0 if "</answer>" in completion else 0.0  # an open block alone is no answer
            assert score.parts == {"format": closed, "answer": expected}
    # The opening is part of the scored turn: step() takes the completion alone.
    env.reset(options={"split": "test", "index": 0})
    _, reward, terminated, _, info = env.step(f"Easy.</think>\n<answer>{examples[0].answer}</answer>")
    assert (reward, terminated, info["correct"]) == (1.0, True, True)
    env.close()
    opened = make(task, train_size=0, test_size=1, opening="<think>x</think>\n<answer>")
    assert opened.score(f"{examples[0].answer}</answer>", opened.examples("test")[0]).reward == 1.0
    assert opened.score(f"{examples[0].answer}", opened.examples("test")[0]).reward == 0.0  # the stop token came first
    opened.close()
    lenient = make(task, train_size=0, test_size=1, opening="<think>x</think>\n<answer>", lenient_unclosed=True)
    assert lenient.score(f"{examples[0].answer}", lenient.examples("test")[0]).reward == 1.0  # read to the end
    lenient.close()


@pytest.mark.parametrize("task", ["basic_arithmetic", "word_sorting", "spell_backward", "letter_jumble"])
def test_closed_answers_scored_as_reasoning_gym(task, forked):
    """With a closed <answer> block in the turn, the env reads and scores what reasoning-gym's own
    extract_answer + the task's score_answer do, whatever follows the block."""
    from reasoning_gym.utils import extract_answer

    env = make(task, train_size=0, test_size=3)
    env.prepare_scoring()
    cases = []
    for ex in env.examples("test"):
        right = ex.answer
        for completion in [golden(right), golden(right) + "\nMore text.\n<answer>",  # the review's case
                           golden(right) + "\n<answer>wrong", golden(right) + f"<answer>{right}",
                           golden("wrong") + f"\n<answer>{right}", golden(f"{right} and a lot of junk"),
                           golden("wrong") + golden(f" {right.upper()} ") + "\n<answer>\n"]:
            cases.append((completion, ex))
    scores = env.score_batch([c for c, _ in cases], [e for _, e in cases], workers=1)
    for (completion, ex), score in zip(cases, scores):
        turn = ex.opening + completion
        expected = env._scoring_dataset.score_answer(extract_answer(turn), rg.entry(ex))
        assert final_answer(turn) == extract_answer(turn) and score.error is None, completion
        assert (score.reward, score.parts) == (expected, {"format": 1.0, "answer": expected}), completion
    assert sum(s.reward == 1.0 for s in scores) >= 3 * 4  # the right answer, before open or later blocks
    env.close()


@pytest.mark.parametrize("task", ["spell_backward", "letter_jumble"])
def test_correct_needs_the_exact_answer_not_junk_rounding_to_one(task, forked):
    """spell_backward and letter_jumble give partial credit per letter / word, summing 1/n in floats:
    an answer with junk after the right one lands on 0.9999999999999999 or 1.0000000000000002
    (letter_jumble: often exactly 1.0). It is not correct; the exact answer (any case) is."""
    env = make(task, train_size=0, test_size=50)
    examples = list(env.examples("test"))
    completions = [golden(e.answer) for e in examples] + [golden(e.answer.upper()) for e in examples]
    junk = [golden(f"{e.answer} and a lot of junk") for e in examples]
    scores = env.score_batch(completions + junk, examples * 3, workers=1)
    exact, junked = scores[:100], scores[100:]
    assert all((s.reward, s.correct) == (1.0, True) for s in exact)
    assert not any(s.correct for s in junked), [s.reward for s in junked if s.correct]
    # The artefact is there to be caught: junk answers scored a rounding error off 1.
    assert sum(0 < abs(s.reward - 1.0) < 1e-9 for s in junked) >= 5
    if task == "letter_jumble":  # extra words are free and the sum is clamped: exactly 1.0 too
        assert any(s.reward == 1.0 for s in junked)
    env.close()


@pytest.mark.parametrize("lenient", [False, True])
def test_format_part_says_how_the_scored_block_was_read(forked, lenient):
    env = make("basic_arithmetic", **TINY, train_size=0, test_size=1, lenient_unclosed=lenient)
    ex = env.examples("test")[0]
    right = ex.answer
    opened = (1.0, 0.5) if lenient else (0.0, 0.0)  # an open block alone: read to the end only if lenient
    cases = {  # completion: (reward, format)
        f"<answer>{right}</answer><answer>{right}": (1.0, 1.0),  # the closed block is the one scored
        f"<answer>{right}</answer> then <answer>wrong": (1.0, 1.0),
        f"<answer>wrong</answer> then <answer>{right}": (0.0, 1.0),
        f"<answer>{right}": opened,
        f"</answer> <answer><answer>{right}": opened,
        f"the answer is {right}": (0.0, 0.0),
    }
    scores = env.score_batch(list(cases), [ex] * len(cases), workers=1)
    for (completion, (reward, fmt)), score in zip(cases.items(), scores):
        parts = {"format": fmt, "answer": reward}
        assert (score.reward, score.correct, score.parts) == (reward, reward == 1.0, parts), completion
    env.close()


def test_composite_with_datasets(forked):
    specs = [{"name": "chain_sum"}, {"name": "gcd", "weight": 2, "config": {"max_value": 50}}]
    env = make("composite", datasets=specs, train_size=6, test_size=6)
    test = env.examples("test")
    assert {e.meta["metadata"]["source_dataset"] for e in test + list(env.examples("train"))} == {"chain_sum", "gcd"}
    scores = env.score_batch([golden(e.answer) for e in test] + [golden("wrong")], list(test) + [test[0]], workers=1)
    assert [s.reward for s in scores] == [1.0] * 6 + [0.0]
    env.close()
    with pytest.raises(ValueError, match="needs 'name'"):
        make("composite", datasets=[{"weight": 1}])
    with pytest.raises(ValueError, match="rg/composite-v0: reasoning-gym cannot build the dataset: .*nope"):
        make("composite", datasets=[{"name": "nope"}]).examples("test")


# ----- time bounds: worker processes --------------------------------------------------------------------
def test_score_workers_and_a_small_pickle():
    env = make("chain_sum", train_size=200, test_size=50)
    env.examples("train")
    assert env.score_workers is None  # worker processes, killable: never score_workers = 0
    assert len(pickle.dumps(env)) < 5_000  # a worker gets the task and config, not 250 examples
    copy = pickle.loads(pickle.dumps(env))
    assert copy.task_config == env.task_config and copy._scoring_dataset is None
    assert questions(copy.examples("test")) == questions(env.examples("test"))  # rebuilt on demand, the same


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_batch_scorer_in_fresh_worker_processes(monkeypatch, method):
    """A fresh worker (not forked from this process) rebuilds the env from its pickle: it imports
    llm_envs and reasoning-gym and builds the dataset in prepare_scoring."""
    monkeypatch.setattr(scoring, "start_method", lambda: method)
    env = make("gcd", train_size=0, test_size=3, max_value=200)
    examples = list(env.examples("test"))
    with llm_envs.BatchScorer(env, workers=1) as scorer:
        scores = scorer.score_batch([golden(e.answer) for e in examples] + [golden("wrong")], examples + examples[:1])
    assert [(s.reward, s.correct, s.error) for s in scores] == [(1.0, True, None)] * 3 + [(0.0, False, None)]


def _sleep_forever(self, answer, entry):
    if answer is None:  # no answer block (scored too, as reasoning-gym does): the worker's start
        return 0.0
    time.sleep(600)


def _sleep_deaf_to_the_timer(self, answer, entry):
    # Like a long C call (sympy): the worker's own SIGALRM cannot stop it, only a kill can.
    if answer is None:
        return 0.0
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


@pytest.mark.parametrize("hang", [_sleep_forever, _sleep_deaf_to_the_timer])
def test_hanging_scorer_times_out(monkeypatch, forked, hang):
    monkeypatch.setattr(rg.installed_tasks()["chain_sum"][0], "score_answer", hang)
    env = make("chain_sum", train_size=0, test_size=2)
    env.score_timeout = 0.5
    ex = env.examples("test")[0]
    assert env.score("no answer block", ex).error is None  # starts the worker (not timed)
    start = time.monotonic()
    score = env.score(golden(ex.answer), ex)
    elapsed = time.monotonic() - start
    assert (score.reward, score.correct, score.error) == (0.0, False, "timeout")
    assert elapsed < 0.5 + scoring.GRACE + 3.0, elapsed
    assert env.score("still no answer", ex).error is None  # a killed worker is replaced
    env.close()


# ----- every task: check_env ---------------------------------------------------------------------------
@pytest.mark.parametrize("task", rg.TASKS)
def test_check_env_every_task(task, forked):
    if task in rg.NEEDS_CONFIG:  # known: the default config cannot build it; make says what to pass
        with pytest.raises(ValueError) as info:
            make(task)
        assert str(info.value).startswith(f"rg/{task}-v0: invalid config: ") and "\n" not in str(info.value)
        assert rg.NEEDS_CONFIG[task] in str(info.value)
        return
    env = make(task)
    check_env(env, skip_render_check=True)
    assert len(env.examples("test")) == 4 and len(env.examples("train")) <= 4
    obs, info = env.reset(seed=0, options={"split": "test", "index": 1})
    assert obs.endswith(OPENING) and info["example_id"] == f"{task}-test-1"
    env.close()


# ----- python -m llm_envs.list ---------------------------------------------------------------------------
def test_list_prints_every_id_with_a_description(capsys):
    assert list_main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = [line.split()[0] for line in lines]
    assert ids == llm_envs.ENV_IDS + llm_envs.RG_ENV_IDS
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)  # each has a description
    described = dict(line.split(maxsplit=1) for line in lines)
    assert described["rg/gcd-v0"] == "Generates Greatest Common Divisor (GCD) tasks"
    assert described["Countdown-v0"].startswith("Countdown puzzles")
    assert described["rg/arc_agi-v0"].startswith("config: use_train")  # no docstring: its config's fields


def test_list_namespace_filter_and_fields(capsys):
    assert list_main(["--namespace", "rg", "arith"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert "rg/basic_arithmetic-v0" in ids and all(i.startswith("rg/") for i in ids)
    assert list_main(["--namespace", "none"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == llm_envs.ENV_IDS
    assert list_main(["--fields", "rg/gcd-"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == [
        "min_numbers=2,", "max_numbers=2,", "min_value=1,", "max_value=1000"]
    assert list_main(["no-such-env"]) == 1


def test_list_cli_help_and_bad_flag():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "llm_envs.list", *args], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)  # from the checkout: its llm_envs is the one run

    helped = run("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m llm_envs.list")
    bad = run("--no-such-flag")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "python -m llm_envs.list: error: unrecognized arguments: --no-such-flag (--help lists the options)"]


def test_final_answer_reads_the_last_closed_block_else_one_left_open():
    assert final_answer("<answer> 7 </answer>") == "7"
    assert final_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert final_answer("<answer>1</answer> then <answer> 2") == "1"  # a closed block beats an open one
    assert final_answer("<answer>1</answer> then <answer>") == "1"
    assert final_answer("<answer> 1 + 6 = 7") == "1 + 6 = 7"  # no closed block: the open one, to the end
    assert final_answer("</answer> <answer> 2") == "2" and final_answer("<answer> <answer> 2") == "2"
    assert final_answer("no block at all") is None and final_answer("<answer>") == ""
    # Linear, whatever the input: no closing tag, or many opening tags after the last one.
    assert final_answer("<answer>" * 20_000 + "x") == "x"
    assert final_answer("<answer>1</answer>" + "<answer>" * 20_000 + "x") == "1"
    assert last_tag("<answer>" * 20_000 + "x", "answer") is None


def test_final_answer_reads_closed_blocks_as_reasoning_gym():
    from reasoning_gym.utils import extract_answer

    texts = ["<answer> 5 </answer>", "<answer>5</answer> more text <answer>", "<answer>5</answer><answer>5",
             "<answer>1</answer>\n<answer>\n2\n</answer> <answer>3", "<answer><answer>5</answer></answer>",
             "</answer><answer>5</answer>", "<think>x</think><answer>a\nb</answer>\n<answer>"]
    for text in texts:
        assert final_answer(text) == last_tag(text, "answer") == extract_answer(text), text
