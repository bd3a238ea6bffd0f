"""Multi-turn envs in TRL's GRPOTrainer through ``rollout_func`` (``trainers.trl.EpisodeRollout``),
driving our engine (the hf engine over the trainer's own tiny model) on the docs' Bulls-and-Cows env
(``examples/bulls_cows.py``, a tool over hidden state, every prompt the same text)."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest

trl = pytest.importorskip("trl")

import llm_envs  # noqa: E402
from tests.test_multiturn_docs import TINY_TURNS  # noqa: E402
from trainers.common.episodes import EpisodeTally, run_episodes  # noqa: E402
from trainers.engines.hf import HFEngine  # noqa: E402
from trainers.trl import EpisodeReturn, EpisodeRollout, dataset, prompt_text  # noqa: E402

ENV = "examples.bulls_cows:BullsAndCows-v0"


def test_grpo_trainer_trains_on_our_engines_episodes_of_training_examples_only(tiny_model, tiny_tokenizer, tmp_path,
                                                                              monkeypatch):
    env = llm_envs.make(ENV, train_size=8, test_size=8, **TINY_TURNS)
    model = copy.deepcopy(tiny_model)
    rollout = EpisodeRollout(env, tiny_tokenizer, max_new_tokens=6)
    calls = []
    real_draw, real_call = EpisodeRollout.draw, EpisodeRollout.__call__

    def draw(self, prompts, trainer):
        calls.append({"drawn": real_draw(self, prompts, trainer), "training": trainer.model.training})
        return calls[-1]["drawn"]

    def call(self, prompts, trainer):
        out = real_call(self, prompts, trainer)
        examples, seeds = calls[-1]["drawn"]
        # the same draws on a fresh engine over the same weights give the same episodes: ours made them
        with llm_envs.BatchScorer(self.env, 0) as scorer:
            again = run_episodes(HFEngine(trainer.accelerator.unwrap_model(trainer.model), self.tokenizer), scorer,
                                 examples, self.max_new_tokens, temperature=1.0, seed=seeds)
        assert [e.ids for e in again] == out["completion_ids"] and [e.mask for e in again] == out["env_mask"]
        calls[-1].update(prompts=list(prompts), out=out)
        return out

    monkeypatch.setattr(EpisodeRollout, "draw", draw)
    monkeypatch.setattr(EpisodeRollout, "__call__", call)
    config = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=2,
                            per_device_train_batch_size=4, max_completion_length=env.episode_tokens(6), max_steps=2,
                            learning_rate=1e-2, save_strategy="no", report_to=[], disable_tqdm=True, seed=0,
                            logging_steps=1)
    train = dataset(env, tiny_tokenizer, "train")
    trainer = trl.GRPOTrainer(model=model, processing_class=tiny_tokenizer, reward_funcs=[EpisodeReturn()],
                              train_dataset=train, args=config, rollout_func=rollout)
    trainer.train()
    rollout.close()
    assert len(calls) == 2 and all(c["training"] for c in calls)
    train_ids = {e.id for e in env.examples("train")}
    for c in calls:
        examples, _ = c["drawn"]
        assert {e.id for e in examples} <= train_ids  # never a test example, though all share one prompt text
        assert examples[0] is examples[1] and examples[2] is examples[3]  # a group shares its example
        out = c["out"]
        assert out["prompt_ids"] == [tiny_tokenizer(p, add_special_tokens=False)["input_ids"] for p in c["prompts"]]
        assert all(p == prompt_text(tiny_tokenizer, examples[0]) for p in c["prompts"])
        for ids, mask, stats in zip(out["completion_ids"], out["env_mask"], out["episode_stats"]):
            assert len(ids) == len(mask) and mask[0] == 1 and stats["tool_calls"] == 1  # the first turn called digit_at
            assert (0 in mask) == (stats["turns"] > 1)  # an env reply (masked 0) between model turns
        assert sum(s["turns"] > 1 for s in out["episode_stats"]) >= 2  # most turns end at a stop string
    logs = [h for h in trainer.state.log_history if "rewards/episode_return/mean" in h]
    assert len(logs) == 2
    for log, c in zip(logs, calls):
        out = c["out"]
        assert log["rewards/episode_return/mean"] == pytest.approx(sum(out["episode_return"]) / 4)
        assert log["completions/mean_length"] == pytest.approx(sum(sum(m) for m in out["env_mask"]) / 4)
        tally = EpisodeTally()
        tally.add(out["episode_stats"])
        assert log["turns_mean"] == pytest.approx(tally.means()["turns_mean"]) and log["tool_calls_mean"] == 1.0
        assert math.isfinite(log["loss"])


def _trainer(process: int, training: bool = True):
    return SimpleNamespace(num_generations=2, num_generations_eval=2, model=SimpleNamespace(training=training),
                           accelerator=SimpleNamespace(num_processes=2, process_index=process))


def test_a_group_that_spans_two_processes_shares_its_example(tiny_tokenizer, monkeypatch):
    """Two processes with 3 prompts each and groups of 2: the second group is prompt 3 of process
    0 and prompt 1 of process 1. Its groups are numbered over both, so both draw one example."""
    import accelerate.utils

    env = llm_envs.make(ENV, train_size=50, test_size=50)
    text = prompt_text(tiny_tokenizer, env.examples("train")[0])
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda counts: [3, 3])
    first, second = (EpisodeRollout(env, tiny_tokenizer, seed=7) for _ in range(2))
    (a, _), (b, _) = first.draw([text] * 3, _trainer(0)), second.draw([text] * 3, _trainer(1))
    step = a + b
    assert step[0] is step[1] and step[2] is step[3] and step[4] is step[5]
    assert len({id(step[0]), id(step[2]), id(step[4])}) == 3  # groups draw their own examples
    (c, _), (d, _) = first.draw([text] * 3, _trainer(0, training=False)), second.draw([text] * 3, _trainer(1, False))
    assert all(e.id.startswith("test-") for e in c + d) and (c + d)[2] is (c + d)[3]  # evaluation: the test split
    first.close()
    second.close()


def test_a_prompt_that_is_no_examples_is_refused(tiny_tokenizer):
    rollout = EpisodeRollout(llm_envs.make("GuessNumber-v0", train_size=2, test_size=1), tiny_tokenizer)
    with pytest.raises(KeyError, match="trainers.trl.dataset"):
        rollout.example_of("some other prompt", 0)
    rollout.close()
