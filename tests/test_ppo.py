"""PPO: token rewards, GAE and the clipped losses on hand-computed examples, the separate critic
(its own parameters and gradient clip), and an end-to-end run on a tiny random model and a
trivially learnable env (the reward must rise), with resume."""

import copy
import json
import math
from pathlib import Path

import pytest
import torch

import llm_envs
from trainers.rl import ppo
from trainers.engines.hf import HFEngine
from trainers.rl.ppo import PPO, PPOConfig, gae, ppo_loss, token_rewards
from trainers.rl import loop, policy
from trainers.rl.sampling import sample

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


def test_each_parameter_group_is_clipped_on_its_own():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    a.grad, b.grad = torch.tensor([3.0, 4.0]), torch.tensor([30.0, 40.0])
    seen = {}

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.update(a=a.grad.clone(), b=b.grad.clone())

    norms = policy.clip_and_step(Spy([{"params": [a]}, {"params": [b]}], lr=0.0), max_grad_norm=1.0)
    assert norms == pytest.approx([5.0, 50.0])
    assert torch.allclose(seen["a"], torch.tensor([0.6, 0.8])) and torch.allclose(seen["b"], torch.tensor([0.6, 0.8]))


def policy_gradient(tiny_model, tiny_tokenizer, model_dir, samples, **options) -> dict[str, torch.Tensor]:
    """The policy's gradient in one PPO update (captured instead of applied)."""
    cfg = PPOConfig(env=LETTER, model=str(model_dir), group_size=2, max_new_tokens=6, beta=0.0, max_grad_norm=0,
                    whiten_advantages=False, **options)
    cfg.validate()
    model = copy.deepcopy(tiny_model).requires_grad_(True)
    algo = PPO(cfg, model, tiny_tokenizer)
    with torch.no_grad():  # a critic that reads its hidden states (the zero init does not)
        algo.value_head.linear.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    captured = {}

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            captured.update({n: p.grad.clone() for n, p in model.named_parameters()})

    algo.update(algo.prepare(samples), Spy(algo.param_groups(), lr=0.0))
    return captured


def test_the_separate_critic_never_moves_the_policy(tiny_model, tiny_tokenizer, tiny_model_dir):
    env = llm_envs.make(LETTER)
    s = sample(HFEngine(tiny_model, tiny_tokenizer), env, env.examples("train")[:2], 2, 6, seed=0)
    cfg = PPOConfig(env=LETTER, model=str(tiny_model_dir), beta=0.0)
    cfg.validate()
    algo = PPO(cfg, copy.deepcopy(tiny_model), tiny_tokenizer)
    policy_params, critic_params = ({id(p) for p in g["params"]} for g in algo.param_groups())
    assert not policy_params & critic_params and algo.param_groups()[1]["lr"] == cfg.value_lr
    assert set(algo.modules) == {"value_head", "critic_trunk"}  # both checkpointed
    base = dict(tiny_model.model.named_parameters())
    assert all(torch.equal(p, base[n]) for n, p in algo.trunk.named_parameters())  # a copy of the base model
    # the value loss's weight changes nothing in the policy's gradient; with a shared trunk it does
    separate = [policy_gradient(tiny_model, tiny_tokenizer, tiny_model_dir, s, vf_coef=c) for c in (0.0, 1.0)]
    assert all(torch.equal(separate[0][n], separate[1][n]) for n in separate[0])
    shared = [policy_gradient(tiny_model, tiny_tokenizer, tiny_model_dir, s, vf_coef=c, shared_critic=True)
              for c in (0.0, 1.0)]
    assert not all(torch.equal(shared[0][n], shared[1][n]) for n in shared[0])


def ppo_gradients(tiny_model, tiny_tokenizer, model_dir, samples, **options) -> dict[str, torch.Tensor]:
    """Every gradient of one PPO update (policy, critic trunk, value head; captured instead of
    applied), with the KL to a reference model folded into the rewards."""
    cfg = PPOConfig(env=LETTER, model=str(model_dir), group_size=4, max_new_tokens=6, beta=0.05, max_grad_norm=0,
                    **options)
    cfg.validate()
    model = copy.deepcopy(tiny_model).requires_grad_(True)
    algo = PPO(cfg, model, tiny_tokenizer, ref=copy.deepcopy(tiny_model).requires_grad_(False))
    with torch.no_grad():  # a critic that reads its hidden states (the zero init does not)
        algo.value_head.linear.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    named = {f"policy.{n}": p for n, p in model.named_parameters()}
    named |= {f"head.{n}": p for n, p in algo.value_head.named_parameters()}
    named |= {f"critic.{n}": p for n, p in (algo.trunk.named_parameters() if algo.trunk is not None else [])}
    captured = {}

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            captured.update({n: p.grad.clone() for n, p in named.items()})

    algo.update(algo.prepare(samples), Spy(algo.param_groups(), lr=0.0))
    return captured


@pytest.mark.parametrize("options", [{}, {"shared_critic": True}, {"grad_accum": 2}, {"micro_batch_tokens": 1}])
def test_shared_prefix_gives_the_gradients_of_one_row_per_response(options, tiny_model, tiny_tokenizer,
                                                                   tiny_model_dir):
    """--shared-prefix on (each group's prompt once: policy, old and reference log-probs, the critic's
    states) against off: the same gradients of the policy, the critic trunk and the value head."""
    env = llm_envs.make(LETTER)
    s = sample(HFEngine(tiny_model, tiny_tokenizer), llm_envs.BatchScorer(env, 0), env.examples("train")[:3], 4, 6,
               seed=4)
    s.rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.0, 0.3, 0.9, 0.1, 0.4, 0.4, 0.0, 1.0])
    critic = {"shared_critic": options.get("shared_critic", False)}  # off: the whole batch, the same critic
    off = ppo_gradients(tiny_model, tiny_tokenizer, tiny_model_dir, s, shared_prefix="off", **critic)
    on = ppo_gradients(tiny_model, tiny_tokenizer, tiny_model_dir, s, shared_prefix="on", **options)
    assert set(on) == set(off) and any(n.startswith("critic.") for n in off) != critic["shared_critic"]
    for name in off:
        scale = off[name].abs().max()
        assert scale > 0, f"{name}: no gradient reached it"
        assert float((on[name] - off[name]).abs().max() / scale) < 1e-5, name


def test_ppo_raises_the_reward(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    ppo.main(ppo_args(tiny_model_dir, out))
    train = [r for r in log_of(out) if "reward_mean" in r]
    rewards = [r["reward_mean"] for r in train]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    assert [r["samples"] for r in train] == [32 * k for k in range(1, 9)]
    assert abs(train[0]["kl"]) < 1e-6 and train[-1]["kl"] != 0  # KL to the frozen copy (0 to rounding at first)
    assert train[-1]["value_mean"] != 0  # the critic learned something
    assert (out / "final" / "config.json").is_file()


def test_resume_restores_the_value_head(tmp_path, tiny_model_dir, monkeypatch, kill_on_call):
    out = tmp_path / "run"
    args = ppo_args(tiny_model_dir, out, "--steps", "3", "--checkpoint-every", "2", "--batch-size", "2",
                    "--group-size", "2")
    with kill_on_call(loop, "sample", 3):
        ppo.main(args)
    saved = torch.load(out / "checkpoints" / "000002" / "trainer.pt", weights_only=False)
    head = saved["modules"]["value_head"]
    assert head["linear.weight"].abs().sum() > 0  # trained, not the zero init
    trunk = saved["modules"]["critic_trunk"]  # the critic's own trunk

    restored = {}
    real_restore = loop.restore_trainer

    def spy(run, step, optimizer, modules=None):
        real_restore(run, step, optimizer, modules)
        restored.update({k: v.detach().clone() for k, v in modules["value_head"].state_dict().items()})
        restored.update({"trunk." + k: v.detach().clone() for k, v in modules["critic_trunk"].state_dict().items()})

    monkeypatch.setattr(loop, "restore_trainer", spy)
    ppo.main(["--resume", str(out)])
    assert torch.equal(restored["linear.weight"], head["linear.weight"])
    assert all(torch.equal(restored["trunk." + k], v) for k, v in trunk.items())
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
