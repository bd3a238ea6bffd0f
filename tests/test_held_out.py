"""One held-out evaluation: a trainer's logged ``eval_pass@1`` / ``eval_reward`` and the harness's
greedy pass@1 / mean reward (``python -m eval``) on the same model, split and max_new_tokens are
the same numbers, because both go through ``trainers.common.rollout`` (same examples, generation and
scoring)."""

import json
from pathlib import Path

import pytest

import eval.__main__ as cli
import eval.harness as harness
from trainers.es import train as es
from trainers.rl import grpo
from trainers.common import rollout
from trainers.engines.hf import HFEngine

pytestmark = pytest.mark.usefixtures("one_thread")

TRAINERS = {
    # sigma is large because a tiny random model's greedy text must change under perturbation
    "es": (es, ["--env", "Conciseness-v0", "--iterations", "2", "--population", "4", "--sigma", "0.05",
                "--alpha", "0.02", "--max-new-tokens", "6", "--eval-limit", "5", "--seed", "3"]),
    "grpo": (grpo, ["--env", "Conciseness-v0", "--steps", "2", "--batch-size", "2", "--group-size", "4",
                    "--lr", "1e-2", "--max-new-tokens", "6", "--seed", "0"]),
}


@pytest.mark.parametrize("name", list(TRAINERS))
def test_trainer_pass_at_1_equals_the_harness(name, tmp_path, tiny_model_dir, monkeypatch):
    trainer, args = TRAINERS[name]
    run = tmp_path / "run"
    trainer.main([*args, "--model", str(tiny_model_dir), "--out", str(run)])
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    final = [r for r in logged if "eval_pass@1" in r][-1]
    assert final["iteration"] == 2

    assert harness.rollout is rollout.rollout and harness.eval_examples is rollout.eval_examples
    calls = []
    monkeypatch.setattr(harness, "rollout", lambda *a, **k: calls.append(1) or rollout.rollout(*a, **k))
    env = args[args.index("--env") + 1]
    harness_args = ["--env", env, "--model", str(run), "--max-new-tokens", "6", "--cache", "off",
                    "--out", str(tmp_path / "eval")]
    if "--eval-limit" in args:
        harness_args += ["--limit", args[args.index("--eval-limit") + 1]]
    [summary] = cli.main(harness_args)
    assert calls, "the harness must measure through trainers.common.rollout"
    assert summary["temperature"] == 0.0 and summary["split"] == "test"
    assert summary["pass@1"] == final["eval_pass@1"]
    assert summary["reward_mean"] == final["eval_reward"]
    assert summary["reward_mean"] != 0.0  # a real comparison, not two zeros
    assert Path(summary["file"]).is_file()


def test_distributed_held_out_evaluation_is_shared_across_ranks(tiny_model, tiny_tokenizer, monkeypatch):
    """With P processes each evaluates every P-th example (disjoint shares covering the split), and
    the summed counts give every rank the numbers one process measures alone."""
    import llm_envs

    env = llm_envs.make("Conciseness-v0")
    scorer = llm_envs.BatchScorer(env, 0)
    seen: list[list[str]] = []
    real = rollout.rollout
    monkeypatch.setattr(rollout, "rollout", lambda engine, s, examples, *a, **k: seen.append([e.id for e in examples])
                        or real(engine, s, examples, *a, **k))
    engine = HFEngine(tiny_model, tiny_tokenizer)
    alone = rollout.evaluate(engine, scorer, "test", 6)
    partial = []
    for rank in range(3):
        partial.append(None)
        rollout.evaluate(engine, scorer, "test", 6, rank=rank, world=3,
                         all_sum=lambda sums, rank=rank: partial.__setitem__(rank, sums.copy()) or sums)
    everything, *shares = seen
    assert sorted(sum(shares, [])) == sorted(everything) and all(shares)  # disjoint shares, the whole split
    assert len({tuple(s) for s in shares}) == 3
    total = sum(partial)  # what the all-reduce gives every rank
    assert total[0] / total[2] == alone["pass@1"] and total[1] / total[2] == pytest.approx(alone["reward"])


def test_runs_from_the_same_weights_share_their_evaluation_before_training(tmp_path, tiny_model_dir, monkeypatch):
    """``--base-eval FILE``: the first run evaluates the model before training and adds the record;
    a run with other hyperparameters, another seed or another trainer logs that record instead of
    evaluating; other evaluation settings (or weights, or code) make a new record."""
    import trainers.common.held_out as held_out

    evaluated = []  # the iteration of every evaluation that ran
    real = held_out.evaluate
    monkeypatch.setattr(held_out, "evaluate", lambda *a, **k: evaluated.append(k["progress"]) or real(*a, **k))
    shared = tmp_path / "base.json"
    es_args = TRAINERS["es"][1] + ["--model", str(tiny_model_dir), "--base-eval", str(shared)]

    def run(trainer, args, name) -> list[dict]:
        evaluated.clear()
        trainer.main([*args, "--out", str(tmp_path / name), "--report-to", "none"])
        return [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]

    first = run(es, es_args, "first")
    assert len(evaluated) == 2  # before training and after
    [entry] = json.loads(shared.read_text()).values()
    assert entry["record"] == first[0] and first[0]["iteration"] == 0 and entry["run"] == str(tmp_path / "first")

    other = run(es, es_args + ["--seed", "4", "--alpha", "0.05"], "other")
    assert len(evaluated) == 1  # after training only
    assert other[0] == first[0] and [r for r in other if "eval_reward" in r][-1]["iteration"] == 2
    grpo_args = TRAINERS["grpo"][1] + ["--model", str(tiny_model_dir), "--base-eval", str(shared), "--eval-limit", "5"]
    rl = run(grpo, grpo_args, "grpo")
    assert len(evaluated) == 1 and rl[0] == first[0]  # the same weights, examples and decoding
    assert len(json.loads(shared.read_text())) == 1

    fewer = run(es, es_args + ["--eval-limit", "4"], "fewer")
    assert len(evaluated) == 2 and fewer[0]["eval_n"] == 4
    assert len(json.loads(shared.read_text())) == 2


def test_the_key_of_an_evaluation_before_training_follows_the_weights_and_settings(tiny_model, tiny_tokenizer):
    import copy

    import torch

    from trainers.common import base_eval

    cfg = es.resolve(["--env", "Conciseness-v0", "--eval-limit", "5", "--out", "unused"])
    engine = HFEngine(tiny_model, tiny_tokenizer)
    key = base_eval.key(cfg, engine, 32, 1)
    assert base_eval.key(es.resolve(["--env", "Conciseness-v0", "--eval-limit", "5", "--out", "x", "--seed", "9",
                                     "--alpha", "0.3"]), engine, 32, 1) == key
    changed = copy.deepcopy(tiny_model)
    with torch.no_grad():
        next(changed.parameters()).view(-1)[0] += 1.0
    assert base_eval.key(cfg, HFEngine(changed, tiny_tokenizer), 32, 1) != key
    assert base_eval.key(cfg, engine, 16, 1) != key and base_eval.key(cfg, engine, 32, 2) != key
    for flag, value in (("--max-new-tokens", "5"), ("--eval-split", "train"), ("--env-args", '{"n": 3}')):
        other = es.resolve(["--env", "Conciseness-v0", "--eval-limit", "5", "--out", "unused", flag, value])
        assert base_eval.key(other, engine, 32, 1) != key, flag
