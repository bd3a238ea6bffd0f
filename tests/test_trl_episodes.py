"""Multi-turn envs in TRL's GRPOTrainer through ``rollout_func`` (``trainers.trl``)."""

from __future__ import annotations

import copy
import math

import pytest

trl = pytest.importorskip("trl")

import llm_envs  # noqa: E402
from trainers.trl import dataset  # noqa: E402
from tests.test_multiturn import Scripted  # noqa: E402
from trainers import trl as trl_episodes  # noqa: E402
from trainers.trl import EpisodeReturn, EpisodeRollout  # noqa: E402


def test_grpo_trainer_trains_on_episodes(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    env = llm_envs.make("GuessNumber-v0", max_turns=2, train_size=4, test_size=2)
    model = copy.deepcopy(tiny_model)
    # turn 1 always wrong, turn 2 right only when the secret is 50: returns differ within the data
    monkeypatch.setattr(trl_episodes, "HFEngine",
                        lambda m, tok: Scripted(tok, ["<guess>0</guess>", "<guess>50</guess>"]))
    rollout = EpisodeRollout(env, tiny_tokenizer, splits=("train",))
    outputs = []
    real_call = EpisodeRollout.__call__
    monkeypatch.setattr(EpisodeRollout, "__call__", lambda self, p, t: outputs.append(real_call(self, p, t)) or outputs[-1])
    config = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=2,
                            per_device_train_batch_size=4, max_completion_length=env.episode_tokens(), max_steps=1,
                            learning_rate=1e-2, save_strategy="no", report_to=[], disable_tqdm=True, seed=0)
    trainer = trl.GRPOTrainer(model=model, processing_class=tiny_tokenizer, reward_funcs=[EpisodeReturn()],
                              train_dataset=dataset(env, tiny_tokenizer, "train"), args=config, rollout_func=rollout)
    trainer.train()
    rollout.close()
    [out] = outputs
    assert len(out["completion_ids"]) == 4 and all(t == 2 for t in out["episode_turns"])
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        assert len(ids) == len(mask) and 0 in mask and mask[0] == 1  # model turn, env reply, model turn
    [log] = [h for h in trainer.state.log_history if "rewards/episode_return/mean" in h]
    expected = sum(out["episode_return"]) / 4
    assert log["rewards/episode_return/mean"] == pytest.approx(expected) and math.isfinite(log["train_loss"])
    assert log["completions/mean_length"] == pytest.approx(sum(sum(m) for m in out["env_mask"]) / 4)


def test_a_prompt_that_is_no_examples_is_refused(tiny_tokenizer):
    rollout = EpisodeRollout(llm_envs.make("GuessNumber-v0", train_size=2, test_size=1), tiny_tokenizer)
    with pytest.raises(KeyError, match="trainers.trl.dataset"):
        rollout.example_of("some other prompt", 0)
