"""PPO: token rewards, GAE and the clipped losses on hand-computed examples, and an end-to-end
run on a tiny random model and a trivially learnable env (the reward must rise), with resume."""

import json
import math
from pathlib import Path

import pytest
import torch

from trainers import ppo, rl
from trainers.ppo import gae, ppo_loss, token_rewards

LETTER = "toy_envs:Letter-v0"  # reward = share of "a" characters in the completion


pytestmark = pytest.mark.usefixtures("one_thread")


def log_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "log.jsonl").read_text().splitlines()]


def ppo_args(model_dir, out, *extra):
    return ["--env", LETTER, "--model", str(model_dir), "--out", str(out), "--steps", "8", "--batch-size", "4",
            "--group-size", "8", "--lr", "1e-2", "--value-lr", "1e-2", "--eval-every", "0", "--seed", "0", *extra]


# Two completions: 3 tokens and 2 tokens (one pad).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_rewards_fold_the_kl_and_put_the_outcome_last():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    r = token_rewards(torch.tensor([1.0, 2.0]), kl, MASK, beta=0.5)
    assert torch.allclose(r, torch.tensor([[-0.05, -0.1, 1 - 0.15], [-0.2, 2 - 0.25, 0.0]]))
    assert torch.equal(token_rewards(torch.tensor([1.0, 2.0]), None, MASK, beta=0.5),
                       torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]))


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.6, 7.0]])  # 7.0 sits on a pad: ignored
    adv, ret = gae(rewards, values, MASK, lam=0.5)
    # row 0: deltas (gamma 1) t2: 1 - 0.4 = 0.6; t1: 0 + 0.4 - 0.2 = 0.2; t0: 0 + 0.2 - 0.5 = -0.3
    #        A2 = 0.6, A1 = 0.2 + 0.5 * 0.6 = 0.5, A0 = -0.3 + 0.5 * 0.5 = -0.05
    # row 1: t1 (last token): 2 - 0.6 = 1.4; t0: 0 + 0.6 - 0.3 = 0.3 -> A0 = 0.3 + 0.5 * 1.4 = 1.0
    assert torch.allclose(adv, torch.tensor([[-0.05, 0.5, 0.6], [1.0, 1.4, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.45, 0.7, 1.0], [1.3, 2.0, 0.0]]))
    # lambda = 1: the return is the sum of the rewards still to come (Monte Carlo)
    _, ret1 = gae(rewards, values, MASK, lam=1.0)
    assert torch.allclose(ret1, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))


def test_ppo_loss_by_hand():
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.tensor([[0.0, -math.log(1.5)]])  # ratios 1 and 1.5
    adv = torch.tensor([[1.0, 2.0]])
    values = torch.tensor([[0.5, 1.0]], requires_grad=True)
    old_values = torch.tensor([[0.0, 1.0]])
    returns = torch.tensor([[1.0, 0.0]])
    mask = torch.ones(1, 2)
    loss, sums = ppo_loss(logp, old, adv, values, old_values, returns, mask, denominator=2.0, clip_eps=0.2,
                          value_clip=0.2, vf_coef=0.1)
    # policy: -1 * 1, -min(1.5 * 2, 1.2 * 2) = -2.4 -> sum -3.4
    # value, token 0: V 0.5 clipped to 0.2: max((0.5-1)^2, (0.2-1)^2) = 0.64; token 1: (1-0)^2 = 1 -> 0.5 * 1.64
    assert sums["pg_loss"] == pytest.approx(-3.4) and sums["value_loss"] == pytest.approx(0.82)
    assert loss.item() == pytest.approx((-3.4 + 0.1 * 0.82) / 2)
    loss.backward()
    # the clipped value (token 0) passes no gradient; token 1: 0.1 * (V - G) / 2
    assert torch.allclose(values.grad, torch.tensor([[0.0, 0.05]]))
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 0.0]]))


def test_ppo_raises_the_reward(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    ppo.main(ppo_args(tiny_model_dir, out))
    train = [r for r in log_of(out) if "reward_mean" in r]
    rewards = [r["reward_mean"] for r in train]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    assert [r["samples"] for r in train] == [32 * k for k in range(1, 9)]
    assert train[0]["kl"] == 0.0 and train[-1]["kl"] != 0  # KL to the frozen copy, in the reward
    assert train[-1]["value_mean"] != 0  # the critic learned something
    assert (out / "final" / "config.json").is_file()


def test_resume_restores_the_value_head(tmp_path, tiny_model_dir, monkeypatch, kill_on_call):
    out = tmp_path / "run"
    args = ppo_args(tiny_model_dir, out, "--steps", "3", "--checkpoint-every", "2", "--batch-size", "2",
                    "--group-size", "2")
    with kill_on_call(rl, "sample", 3):
        ppo.main(args)
    saved = torch.load(out / "checkpoints" / "000002" / "trainer.pt", weights_only=False)
    head = saved["modules"]["value_head"]
    assert head["linear.weight"].abs().sum() > 0  # trained, not the zero init

    restored = {}
    real_restore = rl.restore_trainer

    def spy(run, step, optimizer, modules=None):
        real_restore(run, step, optimizer, modules)
        restored.update({k: v.detach().clone() for k, v in modules["value_head"].state_dict().items()})

    monkeypatch.setattr(rl, "restore_trainer", spy)
    ppo.main(["--resume", str(out)])
    assert torch.equal(restored["linear.weight"], head["linear.weight"])
    assert [r["iteration"] for r in log_of(out) if "reward_mean" in r] == [1, 2, 3]
    assert (out / "final").is_dir()


@pytest.mark.parametrize("argv, message", [
    (["--lam", "1.5"], "--lam: must be in [0, 1]"),
    (["--kl-estimator", "k2"], "invalid choice"),
    (["--value-lr", "-1"], "--value-lr: must be a positive number"),
])
def test_cli_errors_are_one_clear_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        ppo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
