"""GRPO and Dr.GRPO: the losses on a hand-computed example, the shared RL pieces (log-probs, KL,
gradient accumulation), and end-to-end runs on a tiny random model and a trivially learnable env
(the reward must rise: the update's sign and plumbing), resume, the sample budget and the sweep."""

import copy
import json
import math
import pickle
from pathlib import Path

import pytest
import torch
import yaml

import llm_envs
from trainers.rl import grpo, ppo
from trainers import sweep
from trainers.common import held_out, rollout
from trainers.common.budget import Budget
from trainers.common.config import ConfigError
from trainers.common.models import compute_dtype
from trainers.common.splits import WithValidation
from trainers.engines.hf import HFEngine
from trainers.rl.grpo import GRPO, GRPOConfig, group_advantages, grpo_loss, loss_denominator, tied_groups
from trainers.rl import loop, policy
from trainers.rl.logprobs import pad, token_logprobs
from trainers.rl.losses import kl_k3
from trainers.rl.policy import micro_batches, split_batch
from trainers.rl.sampling import sample

LETTER = "toy_envs:Letter-v0"  # reward = share of "a" characters in the completion


pytestmark = pytest.mark.usefixtures("one_thread")


def log_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "log.jsonl").read_text().splitlines()]


def train_rewards(run_dir) -> list[float]:
    return [r["reward_mean"] for r in log_of(run_dir) if "reward_mean" in r]


def grpo_args(model_dir, out, *extra):
    return ["--env", LETTER, "--model", str(model_dir), "--out", str(out), "--steps", "8", "--batch-size", "4",
            "--group-size", "8", "--lr", "1e-2", "--eval-every", "0", "--seed", "0", *extra]


# ----- the losses, by hand ----------------------------------------------------------------------

# One group of G=2 responses: rewards 1 and 0; response 0 has 2 tokens, response 1 has 3. The
# policy's log-probs are 0; the sampling policy's give ratios [1, 1.5] and [1, 1, 1]. The pad
# position holds garbage: masking must ignore it.
REWARDS = torch.tensor([1.0, 0.0])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
OLD = torch.tensor([[0.0, -math.log(1.5), -30.0], [0.0, 0.0, 0.0]])
EPS = 0.2


def test_group_advantages_by_hand():
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # unbiased std of {1, 0} is sqrt(0.5)
    assert torch.allclose(group_advantages(REWARDS, 2, scale_by_std=True), torch.tensor([a, -a]))
    assert torch.equal(group_advantages(REWARDS, 2, scale_by_std=False), torch.tensor([0.5, -0.5]))
    # groups are independent; equal rewards give zero advantages (no NaN)
    adv = group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2, scale_by_std=True)
    assert torch.allclose(adv, torch.tensor([a, -a, 0.0, 0.0]))
    # ... and such a group gives no gradient: counted as tied
    assert tied_groups(torch.tensor([1.0, 0.0, 2.0, 2.0, 0.0, 0.0]), 2) == 2
    assert tied_groups(torch.tensor([0.0, 0.0, 0.0, 1.0]), 4) == 0 and tied_groups(torch.zeros(8), 4) == 2


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_grpo_and_dr_grpo_losses_by_hand(loss_type):
    adv = group_advantages(REWARDS, 2, scale_by_std=loss_type == "grpo")
    denominator = loss_denominator(loss_type, num_responses=2, num_tokens=5, loss_norm=3)
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, sums = grpo_loss(logp, OLD, adv, MASK, denominator, EPS)
    loss.backward()
    # per token -min(r A, clip(r) A): response 0: -A, -1.2 A (ratio 1.5 clipped to 1.2);
    # response 1 (advantage -A): +A three times. Sum = 0.8 A.
    if loss_type == "grpo":  # A = 0.5 / std, divided by the step's 5 tokens
        A = 0.5 / (math.sqrt(0.5) + 1e-6)
        expected, scale = 0.8 * A / 5, 5
    else:  # A = 0.5 (no std), divided by 2 responses x loss_norm 3
        A = 0.5
        expected, scale = 0.8 * A / 6, 6
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert sums["clip_frac"] == 1  # one clipped token
    # d loss / d logp: -A/scale on the unclipped token, 0 on the clipped one, +A/scale on response 1; 0 on the pad
    grad = torch.tensor([[-A, 0.0, 0.0], [A, A, A]]) / scale
    assert torch.allclose(logp.grad, grad, atol=1e-7)


def test_kl_term_by_hand():
    # ref log-prob log(0.5) on every token, policy log-prob 0: k3 = 0.5 - log(0.5) - 1 = log 2 - 0.5
    k3 = math.log(2) - 0.5
    ref = torch.full((2, 3), math.log(0.5))
    assert torch.allclose(kl_k3(torch.zeros(2, 3), ref), torch.full((2, 3), k3))
    logp = torch.zeros(2, 3)
    adv = group_advantages(REWARDS, 2, scale_by_std=True)
    plain, _ = grpo_loss(logp, OLD, adv, MASK, 5.0, EPS)
    with_kl, sums = grpo_loss(logp, OLD, adv, MASK, 5.0, EPS, beta=0.04, ref_logp=ref)
    assert with_kl.item() == pytest.approx(plain.item() + 0.04 * 5 * k3 / 5, rel=1e-6)
    assert sums["kl"] == pytest.approx(5 * k3, rel=1e-6)


def test_kl_is_zero_against_itself(tiny_model, tiny_tokenizer):
    env = llm_envs.make(LETTER)
    s = sample(HFEngine(tiny_model, tiny_tokenizer), env, env.examples("train"), 3, 6, seed=0)
    batch = pad(s.prompt_ids, s.completion_ids, tiny_tokenizer.pad_token_id)
    logp = token_logprobs(tiny_model, batch)
    ref = token_logprobs(copy.deepcopy(tiny_model), batch)
    assert torch.equal(kl_k3(logp, ref) * batch.mask, torch.zeros_like(logp))
    # and in the trainer: the first step's KL to the frozen copy is exactly 0
    cfg = GRPOConfig(env=LETTER, group_size=3, max_new_tokens=6, beta=0.1)
    cfg.validate()
    model = copy.deepcopy(tiny_model)
    algo = GRPO(cfg, model, tiny_tokenizer, ref=copy.deepcopy(tiny_model))
    stats = algo.update(algo.prepare(s), policy.make_optimizer(algo.param_groups(), 1e-3))
    assert stats["kl"] == 0.0


def test_logprobs_equal_unpadded_forward(tiny_model, tiny_tokenizer):
    env = llm_envs.make(LETTER)
    s = sample(HFEngine(tiny_model, tiny_tokenizer), env, env.examples("train")[:3], 2, 6, seed=1)
    lengths = [len(c) for c in s.completion_ids]
    s.completion_ids[0] = s.completion_ids[0][:2]  # ragged completions
    batch = pad(s.prompt_ids, s.completion_ids, tiny_tokenizer.pad_token_id)
    logp = token_logprobs(tiny_model, batch)
    assert batch.mask.sum().item() == sum(lengths) - lengths[0] + 2
    for i, (p, c) in enumerate(zip(s.prompt_ids, s.completion_ids)):
        with torch.no_grad():
            full = tiny_model(torch.tensor([p + c])).logits[0].log_softmax(-1)
        expected = torch.stack([full[len(p) - 1 + t, tok] for t, tok in enumerate(c)])
        assert torch.allclose(logp[i, :len(c)], expected, atol=1e-5)


def test_sampling_returns_groups_with_token_ids(tiny_model, tiny_tokenizer):
    env = llm_envs.make(LETTER)
    examples = env.examples("train")[:2]
    s = sample(HFEngine(tiny_model, tiny_tokenizer), env, examples, 4, 6, seed=3)
    assert len(s) == 8 and [e.id for e in s.examples] == [examples[0].id] * 4 + [examples[1].id] * 4
    assert all(1 <= len(c) <= 6 for c in s.completion_ids)
    assert len({tuple(c) for c in s.completion_ids}) > 1  # sampled, not greedy
    again = sample(HFEngine(tiny_model, tiny_tokenizer), env, examples, 4, 6, seed=3)
    assert again.completion_ids == s.completion_ids  # seeded
    for ids, text in zip(s.completion_ids, s.texts):
        assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == text


def step_gradients(model, tokenizer, samples, **options) -> dict[str, torch.Tensor]:
    """The gradient of one GRPO update (captured instead of applied)."""
    cfg = GRPOConfig(env=LETTER, group_size=4, max_new_tokens=6, beta=0.05, max_grad_norm=0, **options)
    cfg.validate()
    ref = copy.deepcopy(model).requires_grad_(False)
    algo = GRPO(cfg, model, tokenizer, ref=ref)
    captured = {}

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            captured.update({n: p.grad.clone() for n, p in model.named_parameters()})

    algo.update(algo.prepare(samples), Spy(model.parameters(), lr=0.0))
    return captured


def test_gradient_accumulation_and_checkpointing_give_the_full_batch_gradient(tiny_model, tiny_tokenizer,
                                                                               tiny_model_dir):
    env = llm_envs.make(LETTER)
    s = sample(HFEngine(tiny_model, tiny_tokenizer), env, env.examples("train")[:2], 4, 6, seed=2)
    s.rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.0, 0.3, 0.9, 0.1])
    full = step_gradients(copy.deepcopy(tiny_model), tiny_tokenizer, s)
    accumulated = step_gradients(copy.deepcopy(tiny_model), tiny_tokenizer, s, grad_accum=3)
    assert micro_batches(8, 3) == [slice(0, 3), slice(3, 5), slice(5, 8)]
    model, tokenizer = policy.load_policy(str(tiny_model_dir), "cpu", gradient_checkpointing=True)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    checkpointed = step_gradients(model, tokenizer, s, gradient_checkpointing=True)  # auto: no shared prefix
    for name in full:
        assert torch.allclose(full[name], accumulated[name], atol=1e-6), name
        assert torch.allclose(full[name], checkpointed[name], atol=1e-6), name


@pytest.mark.parametrize("options", [{}, {"grad_accum": 2}, {"micro_batch_tokens": 1}, {"epochs": 2}])
def test_shared_prefix_gives_the_gradient_of_one_row_per_response(options, tiny_model, tiny_tokenizer):
    """--shared-prefix on (each group's prompt once: policy, old and reference log-probs) against off
    (today's path), with whole-group micro-batches by count or by tokens."""
    env = llm_envs.make(LETTER)
    s = sample(HFEngine(tiny_model, tiny_tokenizer), env, env.examples("train")[:3], 4, 6, seed=4)
    s.rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.0, 0.3, 0.9, 0.1, 0.4, 0.4, 0.0, 1.0])
    off = step_gradients(copy.deepcopy(tiny_model), tiny_tokenizer, s, shared_prefix="off")
    on = step_gradients(copy.deepcopy(tiny_model), tiny_tokenizer, s, shared_prefix="on", **options)
    for name in off:
        scale = off[name].abs().max().clamp(min=1e-12)
        assert float((on[name] - off[name]).abs().max() / scale) < 1e-5, name


def test_micro_batches_are_whole_groups_balanced_by_tokens():
    prompts = [[1] * 10] * 8 + [[2] * 5] * 8 + [[3] * 7] * 8  # three groups of 8
    completions = [[0] * n for n in [3, 4, 5, 6, 7, 8, 9, 10] * 3]
    assert split_batch(prompts, completions, True, 3) == [slice(0, 8), slice(8, 16), slice(16, 24)]
    assert split_batch(prompts, completions, True, 5) == [slice(0, 8), slice(8, 16), slice(16, 24)]  # <= groups
    assert split_batch(prompts, completions, True, 1, max_tokens=130) == [slice(0, 16), slice(16, 24)]  # 119 | 59
    assert split_batch(prompts, completions, True, 1, max_tokens=1000) == [slice(0, 24)]
    assert split_batch(prompts, completions, False, 3) == [slice(0, 8), slice(8, 16), slice(16, 24)]  # rows, as before
    rows = split_batch(prompts, completions, False, 1, max_tokens=50)
    assert rows[0] == slice(0, 3) and all(sum(len(prompts[i]) + len(completions[i]) for i in range(p.start, p.stop))
                                          <= 50 for p in rows)
    # several processes agree on the largest count, capped by the fewest units any has
    other = lambda k: max(k, 2 if k > 0 else -3)  # noqa: E731 - another process: 2 parts, 3 groups
    assert len(split_batch(prompts, completions, True, 1, max_tokens=1000, agree=other)) == 2


def test_the_reference_and_policy_follow_the_compute_dtype(tiny_model_dir):
    """The policy keeps fp32 masters and computes in the run's dtype; the frozen reference is loaded
    in that dtype (fp32 runs: fp32)."""
    for compute in (None, torch.bfloat16):
        ref = policy.load_reference(str(tiny_model_dir), "cpu", compute)
        assert {p.dtype for p in ref.parameters()} == {compute or torch.float32}
        assert not any(p.requires_grad for p in ref.parameters())
        model, _ = policy.load_policy(str(tiny_model_dir), "cpu", compute=compute)
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert compute_dtype(model) == compute
        trunk = policy.load_critic_trunk(str(tiny_model_dir), "cpu", compute=compute)
        assert compute_dtype(trunk) == compute and {p.dtype for p in trunk.parameters()} == {torch.float32}


def test_budget():
    b = Budget(max_samples=70)
    assert b.allows(32)
    b.add(32, 100)
    b.add(32, 90)
    assert not b.allows(32) and (b.samples, b.tokens) == (64, 190)
    assert Budget().allows(10 ** 12)


# ----- the trainer, end to end ------------------------------------------------------------------


def test_grpo_raises_the_reward(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    grpo.main(grpo_args(tiny_model_dir, out, "--eval-every", "4"))
    rewards = train_rewards(out)
    assert len(rewards) == 8
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    log = log_of(out)
    train = [r for r in log if "reward_mean" in r]
    assert [r["iteration"] for r in train] == list(range(1, 9))
    assert [r["samples"] for r in train] == [32 * k for k in range(1, 9)]  # cumulative responses
    assert all(b["tokens"] > a["tokens"] for a, b in zip(train, train[1:]))  # cumulative tokens
    assert abs(train[0]["kl"]) < 1e-9 and train[-1]["kl"] > 1e-6  # policy = reference at step 1, to rounding
    assert all(0.0 <= r["frac_reward_zero_std"] <= 1.0 for r in train)  # the share of groups with no gradient
    assert {r["iteration"] for r in log if "eval_pass@1" in r} == {0, 4, 8}
    assert {r["eval_n"] for r in log if "eval_pass@1" in r} == {4}  # Letter-v0's test split, for Table 1
    assert (out / "final" / "config.json").is_file() and (out / "tb").is_dir()
    [runtime] = [json.loads(line) for line in (out / "runtime.jsonl").read_text().splitlines()]
    assert runtime["engine"] == "native"  # --engine auto, the default: native runs the tiny Llama on CPU
    assert runtime["engine_why"].startswith("auto: native runs llama models and was measured faster")


def test_dr_grpo_raises_the_reward_without_a_reference_model(tmp_path, tiny_model_dir, monkeypatch):
    def no_reference(*a, **k):
        raise AssertionError("Dr.GRPO has beta 0: the reference model must not be loaded")

    monkeypatch.setattr(loop, "load_reference", no_reference)
    out = tmp_path / "run"
    grpo.main(grpo_args(tiny_model_dir, out, "--loss", "dr_grpo"))
    assert grpo.resolve(["--loss", "dr_grpo"]).beta == 0.0 and grpo.resolve([]).beta == 1e-3
    rewards = train_rewards(out)
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards


def test_resume_after_kill_continues_from_the_checkpoint(tmp_path, tiny_model_dir, kill_on_call):
    out = tmp_path / "run"
    args = grpo_args(tiny_model_dir, out, "--steps", "4", "--checkpoint-every", "2", "--batch-size", "2",
                     "--group-size", "4")
    with kill_on_call(loop, "sample", 4):  # in step 4, after the checkpoint of step 2
        grpo.main(args)
    ckpt = out / "checkpoints" / "000002"
    assert (ckpt / "trainer.pt").is_file() and not (out / "final").exists()
    saved = torch.load(ckpt / "trainer.pt", weights_only=False)
    assert all(s["step"] == 2 for s in saved["optimizer"]["state"].values())  # two AdamW steps taken
    with pytest.raises(SystemExit):  # the same --out without --resume is refused
        grpo.main(args)
    grpo.main(["--resume", str(out)])
    train = [r for r in log_of(out) if "reward_mean" in r]
    assert [r["iteration"] for r in train] == [1, 2, 3, 4]  # step 3 (lost with the kill) redone once
    assert [r["samples"] for r in train] == [8, 16, 24, 32]
    assert (out / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("trainer, epochs", [("grpo", 1), ("grpo", 2), ("ppo", 2)])
def test_a_killed_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(trainer, epochs, tmp_path,
                                                                                 tiny_model_dir, kill_on_call):
    from safetensors.torch import load_file

    module = {"grpo": grpo, "ppo": ppo}[trainer]
    # epochs 2: batches are sampled at steps 1, 3 and 5, and the checkpoint of step 3 falls between
    # the two optimizer steps on the second batch; the kill comes when step 5 samples.
    steps, every = (5, 3) if epochs == 2 else (3, 2)
    args = lambda out: ["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(out), "--steps", str(steps),  # noqa: E731
                        "--epochs", str(epochs), "--checkpoint-every", str(every), "--batch-size", "2",
                        "--group-size", "4", "--lr", "1e-2", "--eval-every", "0", "--beta", "0.01"]
    module.main(args(tmp_path / "whole"))
    with kill_on_call(loop, "sample", 3):
        module.main(args(tmp_path / "killed"))
    ckpt = tmp_path / "killed" / "checkpoints" / f"{every:06d}"
    assert (ckpt / "batch.pt").is_file() == (epochs == 2)  # a batch still in use is saved
    module.main(["--resume", str(tmp_path / "killed")])
    whole = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    resumed = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    log = lambda out: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in log_of(out)]  # noqa: E731
    assert log(tmp_path / "whole") == log(tmp_path / "killed")


@pytest.mark.parametrize("trainer", ["grpo", "ppo"])
def test_a_kill_during_the_final_evaluation_is_evaluated_on_resume(trainer, tmp_path, tiny_model_dir, kill_on_call):
    """The last step is a checkpoint, so a resumed run has no step left to take: it must still
    measure the final model (the study selects settings on that record)."""
    module = {"grpo": grpo, "ppo": ppo}[trainer]
    out = tmp_path / "run"
    with kill_on_call(held_out, "evaluate", 2):  # 1: step 0, 2: the final model (common/held_out.py, as ES)
        module.main(grpo_args(tiny_model_dir, out, "--steps", "2", "--batch-size", "2", "--group-size", "2",
                              "--checkpoint-every", "1"))
    module.main(["--resume", str(out)])
    assert [r["iteration"] for r in log_of(out) if "eval_reward" in r] == [0, 2]
    assert (out / "final").is_dir()


def test_max_samples_stops_the_run_within_budget(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    grpo.main(grpo_args(tiny_model_dir, out, "--max-samples", "70", "--steps", "10"))
    train = [r for r in log_of(out) if "reward_mean" in r]
    assert [r["samples"] for r in train] == [32, 64]
    assert log_of(out)[-1]["iteration"] == 2 and "eval_reward" in log_of(out)[-1]
    assert (out / "final").is_dir()


def test_max_samples_below_one_batch_is_refused_before_the_run_directory(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        grpo.main(grpo_args(tiny_model_dir, out, "--max-samples", "31"))  # 4 prompts x 8 = 32 per batch
    assert "--max-samples 31 is less than one sampled batch: 4 prompts x 8 responses = 32" in capsys.readouterr().err
    assert not out.exists()


def test_epochs_reuse_each_batch_and_clip(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    grpo.main(grpo_args(tiny_model_dir, out, "--steps", "4", "--epochs", "2"))
    train = [r for r in log_of(out) if "reward_mean" in r]
    assert [r["samples"] for r in train] == [32, 32, 64, 64]  # one sampled batch per 2 optimizer steps
    assert train[0]["clip_frac"] == 0 and train[1]["clip_frac"] > 0  # the second step on a batch is off-policy


@pytest.mark.parametrize("argv, message", [
    (["--env", "Nope-v0"], "unknown env id 'Nope-v0'"),
    (["--loss", "ppo"], "invalid choice"),
    (["--group-size", "1"], "--group-size: must be >= 2"),
    (["--lr", "0"], "--lr: must be a positive number"),
    (["--beta", "-1"], "--beta: must be >= 0"),
    (["--max-samples", "0"], "--max-samples: must be >= 1"),
    (["--resume", "/nonexistent-run"], "--resume /nonexistent-run: no run there"),
])
def test_cli_errors_are_one_clear_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        grpo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_sweep_selects_on_validation_and_reports_test_for_the_selected_run_only(tmp_path, tiny_model_dir,
                                                                                monkeypatch):
    evaluated = []  # (split, example ids) of every held-out evaluation, in order
    real = rollout.eval_examples

    def spy(env, split="test", limit=None):
        examples = real(env, split, limit)
        evaluated.append((split, {e.id for e in examples}))
        return examples

    monkeypatch.setattr(rollout, "eval_examples", spy)
    out = tmp_path / "sweep"
    argv = ["grpo", "--betas", "0,0.01", "--lrs", "1e-6,1e-2", "--metric", "eval_reward", "--out", str(out),
            "--env", LETTER, "--env-args", '{"train_size": 24}', "--val-size", "8", "--model", str(tiny_model_dir),
            "--steps", "3", "--batch-size", "4", "--group-size", "8", "--eval-every", "0"]
    sweep.main(argv)
    summary = json.loads((out / "sweep.json").read_text())
    runs = {r["run"]: r for r in summary["results"]}
    assert set(runs) == {"beta=0_lr=1e-06", "beta=0_lr=0.01", "beta=0.01_lr=1e-06", "beta=0.01_lr=0.01"}
    # every run trained on train minus 8 examples and was evaluated on those 8, never on test
    assert summary["selected_on"] == "validation" and all(r["split"] == "validation" for r in runs.values())
    for k in runs:
        config = yaml.safe_load((out / k / "config.yaml").read_text())
        assert (config["val_size"], config["eval_split"], config["algorithm"]) == (8, "validation", "grpo")
    *during, last = evaluated
    # each run's final model, and the base model once: the other runs log the first one's record of it
    assert len(during) == len(runs) + 1 and all(split == "validation" for split, _ in during)
    [shared] = json.loads((out / "base_held_out.json").read_text()).values()
    assert all(json.loads((out / k / "log.jsonl").read_text().splitlines()[0]) == shared["record"] for k in runs)
    validation = during[0][1]
    assert len(validation) == 8 and all(ids == validation for _, ids in during)  # the same 8 for every run
    assert validation <= {f"train-{i}" for i in range(24)}
    # selection on validation numbers; only then the selected run measured on test, once
    key = lambda k: (runs[k]["eval_reward"], runs[k]["eval_pass@1"], runs[k]["train_reward_late"])  # noqa: E731
    assert summary["best"] == max(runs, key=key)
    assert last == ("test", {f"test-{i}" for i in range(4)})
    assert summary["test"]["run"] == summary["best"] and summary["test"]["split"] == "test"
    assert summary["test"]["n"] == 4 and "eval_reward" in summary["test"]
    assert "lr=0.01" in summary["best"]  # the learning rate that learns wins
    best = out / summary["best"]
    assert (out / "best").resolve() == best.resolve() and (best / "final").is_dir()
    assert all(not (out / k / "final").exists() for k in runs if k != summary["best"])
    assert all((out / k / "log.jsonl").is_file() for k in runs)  # every run keeps its logs
    cfg = grpo.resolve(["--resume", str(out / "beta=0.01_lr=1e-06")])
    assert (cfg.beta, cfg.lr, cfg.steps, cfg.val_size) == (0.01, 1e-6, 3, 8)
    # repeating the command skips the finished runs and the measured test split
    before = {k: (out / k / "log.jsonl").read_text() for k in runs}
    evaluated.clear()
    sweep.main(argv)
    assert {k: (out / k / "log.jsonl").read_text() for k in runs} == before and not evaluated
    assert json.loads((out / "sweep.json").read_text())["test"] == summary["test"]


def test_sweep_refuses_to_carve_a_tiny_train_split(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit):  # Letter-v0 has 4 training prompts (Conciseness-v0: 2)
        sweep.main(["grpo", "--out", str(out), "--env", LETTER, "--model", str(tiny_model_dir)])
    err = capsys.readouterr().err
    assert "0 of the 4 training examples would be held out" in err and "--val-split" in err
    assert not out.exists()
    with pytest.raises(SystemExit):  # selecting on the reported split is the very thing refused
        sweep.main(["grpo", "--out", str(out), "--env", LETTER, "--val-split", "test"])
    assert "--val-split test: that is the split the sweep reports" in capsys.readouterr().err
    assert not out.exists()


def test_sweep_selects_on_a_validation_split_of_the_env(tmp_path, tiny_model_dir):
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"id": f"v{i}", "question": f"Say a ({i}).", "answer": "a"}) + "\n"
                            for i in range(3)))
    out = tmp_path / "sweep"
    sweep.main(["grpo", "--betas", "0", "--lrs", "1e-2", "--out", str(out), "--env", LETTER, "--model",
                str(tiny_model_dir), "--env-args", json.dumps({"data": {"validation": str(data)}}), "--val-split",
                "validation", "--steps", "2", "--batch-size", "4", "--group-size", "4", "--eval-every", "0"])
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["selected_on"] == "validation" and summary["test"]["split"] == "test"
    config = yaml.safe_load((out / summary["best"] / "config.yaml").read_text())
    assert (config["val_size"], config["eval_split"]) == (None, "validation")


def test_validation_split_is_carved_from_train_deterministically(tmp_path):
    env = llm_envs.make(LETTER, train_size=20)
    view = WithValidation(env, 5)
    train, validation = view.examples("train"), view.examples("validation")
    assert len(train) == 15 and len(validation) == 5 and not {e.id for e in train} & {e.id for e in validation}
    assert sorted(e.id for e in train + validation) == sorted(e.id for e in env.examples("train"))
    assert [e.id for e in WithValidation(llm_envs.make(LETTER, train_size=20, seed=7), 5).examples("validation")] \
        == [e.id for e in validation]  # whatever the seed: the same examples for every run
    assert view.examples("test") == env.examples("test") and view.max_new_tokens == env.max_new_tokens
    copy_ = pickle.loads(pickle.dumps(view))  # what scoring workers receive
    assert [e.id for e in copy_.examples("validation")] == [e.id for e in validation]
    assert copy_.score("aaa", validation[0]).reward == 1.0
    with pytest.raises(ConfigError, match="--val-size 20: the train split has 20 examples"):
        WithValidation(env, 20)


def test_a_run_with_val_size_trains_on_the_rest(tmp_path, tiny_model_dir, monkeypatch):
    drawn = []
    real = loop.batch_for
    monkeypatch.setattr(loop, "batch_for", lambda examples, *a: drawn.extend(e.id for e in examples) or real(examples, *a))
    out = tmp_path / "run"
    grpo.main(grpo_args(tiny_model_dir, out, "--env-args", '{"train_size": 12}', "--val-size", "4", "--eval-split",
                        "validation", "--steps", "1"))
    validation = {e.id for e in WithValidation(llm_envs.make(LETTER, train_size=12), 4).examples("validation")}
    assert drawn and not set(drawn) & validation and len(set(drawn)) == 8
    assert [r["eval_n"] for r in log_of(out) if "eval_n" in r] == [4, 4]
    [runtime] = [json.loads(line) for line in (out / "runtime.jsonl").read_text().splitlines()]
    assert runtime["splits"] == {"train": {"examples": 8, "prompts": 8}, "validation": {"examples": 4, "prompts": 4}}
    with pytest.raises(SystemExit):
        grpo.main(grpo_args(tiny_model_dir, tmp_path / "other", "--eval-split", "validation"))


def test_sweep_refuses_flags_it_sets(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["grpo", "--lr", "1e-5", "--env", "Nope-v0"])  # (the env stops it if the check fails)
    assert "--lr is set by the sweep" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [False, True])
def test_deterministic_runs_under_torchs_deterministic_algorithms_and_restores_them(flag, tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    """``--deterministic true`` turns torch's deterministic algorithms on for the run (what a run on a
    GPU needs to repeat bitwise: docs/reliability.md) and leaves the process's own setting as it
    was; without it the run changes nothing."""
    seen, sample = [], loop.sample
    monkeypatch.setattr(loop, "sample", lambda *a, **k: seen.append(torch.are_deterministic_algorithms_enabled())
                        or sample(*a, **k))
    grpo.main(grpo_args(tiny_model_dir, tmp_path / "run", "--steps", "2", "--batch-size", "2", "--group-size", "2",
                        "--deterministic", str(flag).lower()))
    assert seen == [flag, flag] and not torch.are_deterministic_algorithms_enabled()


def test_a_run_with_dropout_repeats_whatever_the_process_rng_was(tmp_path, tiny_model_dir):
    """Dropout draws from torch's global RNG, which torch seeds at random in each process: the run
    seeds it from ``--seed``, so the same command gives the same adapters."""
    adapters = []
    for name, process_seed in (("a", 1), ("b", 2)):
        torch.manual_seed(process_seed)  # the state another process would start in
        grpo.main(grpo_args(tiny_model_dir, tmp_path / name, "--steps", "2", "--lora-rank", "4",
                            "--lora-dropout", "0.5"))
        adapters.append((tmp_path / name / "final" / "adapter_model.safetensors").read_bytes())
    assert adapters[0] == adapters[1]
