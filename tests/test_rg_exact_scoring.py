"""rg/<task>-v0 scores exactly as reasoning-gym does: for every task, on a generated corpus of
completions (closed, unclosed, repeated, nested and empty blocks; text cut mid-block; whitespace and
unicode; the entry's own answer inside and outside tags), the env's reward equals
``dataset.score_answer(reasoning_gym.utils.extract_answer(turn), entry)``, where ``turn`` is the
whole assistant turn (the opening, then the completion). ``lenient_unclosed=True`` differs exactly
where a turn has no closed block but an open one."""

from __future__ import annotations

import gymnasium as gym
import pytest

from llm_envs import scoring
from llm_envs.envs import rg
from llm_envs.parsing import final_answer

#: Entries per task: a few, so that 106 tasks stay within seconds (some generators are slow).
ENTRIES = 2
#: composite needs its sub-tasks named.
CONFIG = {"composite": {"datasets": [{"name": "chain_sum"}, {"name": "gcd"}]}}


def corpus(answer: str) -> list[str]:
    """Completions built around ``answer`` (the entry's own, or a stand-in for tasks without one)."""
    a, w = answer, "wrong"
    full = f"<think>{a} is what I get</think>\n<answer>{a}</answer>"
    start = full.index("<answer>")
    cuts = sorted({start + 3, start + 8, start + 8 + len(a) // 2, start + 8 + len(a), len(full) - 4, len(full) - 1})
    return [
        full, f"<answer>{a}</answer>", f"<answer>{a}", f"<answer> {a} ", f"<answer>{w}</answer> <answer>{a}",  # open
        f"<answer>{w}</answer><answer>{a}</answer>", f"<answer>{a}</answer>\n<answer>{w}</answer>",  # repeated
        f"<answer>{a}</answer> more text <answer>", f"<answer>{a}</answer><answer>{a}",
        f"<answer>{w}<answer>{a}</answer></answer>", f"<answer><answer>{a}</answer>",  # nested
        f"</answer><answer>{a}</answer>", f"<answer>{a}</answer></answer>",
        "<answer></answer>", "<answer> </answer>", f"<answer></answer>{a}", "<answer>", "</answer>", "",  # empty
        *(full[:cut] for cut in cuts),  # cut off mid-block (max_new_tokens)
        f"<answer>\n  {a}\t\n</answer>", f"<answer>\u00a0{a}\u3000</answer>", f"<answer>  \n\n{a}\n\n  </answer>",
        f"< answer>{a}</answer>", f"<ANSWER>{a}</ANSWER>", f"<answer>{a}</answer >", f"<answer>{a}\u200b</answer>",
        f"<answer>{a.upper() if len(a) < 200 else a[:-1]}</answer>", f"<answer>答案 {a} ✓</answer>", f"<answer>{a} because it is</answer>",
        f"The answer is {a}.", a, f"<think>{a}</think>",  # outside tags
    ]


def reference(dataset, text: str, entry: dict):
    """reasoning-gym's own score of a turn, or the exception its scorer raised."""
    from reasoning_gym.utils import extract_answer

    try:
        return float(dataset.score_answer(extract_answer(text), entry))
    except Exception as exc:  # noqa: BLE001 - some scorers reject odd answers by raising
        return exc


@pytest.mark.parametrize("task", rg.TASKS)
def test_reward_equals_reasoning_gyms_on_a_fuzz_corpus(task):
    env = gym.make(rg.env_id(task), train_size=0, test_size=ENTRIES, **CONFIG.get(task, {})).unwrapped
    env.prepare_scoring()
    lenient = gym.make(rg.env_id(task), train_size=0, test_size=ENTRIES, lenient_unclosed=True,
                       **CONFIG.get(task, {})).unwrapped
    lenient._scoring_dataset = env._scoring_dataset  # the same config: one dataset build
    checked = 0
    for ex in env.examples("test"):
        entry = rg.entry(ex)
        for completion in corpus(str(ex.answer) if ex.answer is not None else ex.meta["question"][:20]):
            turn = ex.opening + completion
            expected = reference(env._scoring_dataset, turn, entry)
            score = scoring.checked_score(env, completion, ex)
            if isinstance(expected, Exception):
                assert score.reward == 0.0 and score.error, (task, completion)
                continue
            assert score.error is None and score.reward == expected, (task, completion, score, expected)
            checked += 1
            if score.parts["format"] == 1.0:
                continue  # a closed block: lenient reads the same one (the same code path)
            # lenient: a turn without any block is scored the same; an open block alone is read to the end
            loose = scoring.checked_score(lenient, completion, ex)
            if final_answer(turn) is None:
                assert (loose.reward, loose.parts) == (score.reward, score.parts), (task, completion)
            else:
                assert score.parts["format"] == 0.0, (task, completion)
                opened = reference(env._scoring_dataset, f"<answer>{final_answer(turn)}</answer>", entry)
                if isinstance(opened, Exception):
                    assert loose.error, (task, completion)
                else:
                    assert (loose.reward, loose.parts["format"]) == (opened, 0.5), (task, completion)
    assert checked >= ENTRIES * 20, task  # the corpus was scored, not skipped


def test_an_answer_cut_off_scores_zero_unless_lenient():
    """The rg study's GRPO seed left 99 of 100 answers open and earned partial credit: by default an
    open block is no answer, as in reasoning-gym; lenient_unclosed brings the old reading back and
    says so in reset's info."""
    strict = gym.make("rg/basic_arithmetic-v0", train_size=0, test_size=1, min_terms=2, max_terms=2).unwrapped
    lenient = gym.make("rg/basic_arithmetic-v0", train_size=0, test_size=1, min_terms=2, max_terms=2,
                       lenient_unclosed=True).unwrapped
    ex = strict.examples("test")[0]
    cut = f"<think>easy</think>\n<answer>{ex.answer}"
    assert scoring.checked_score(strict, cut, ex).reward == 0.0
    assert scoring.checked_score(lenient, cut, ex).reward == 1.0
    assert "lenient_unclosed" not in strict.reset(options={"split": "test", "index": 0})[1]
    assert lenient.reset(options={"split": "test", "index": 0})[1]["lenient_unclosed"] is True
    with pytest.raises(TypeError, match="lenient_unclosed must be true or false"):
        gym.make("rg/basic_arithmetic-v0", lenient_unclosed="yes")
