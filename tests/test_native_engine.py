"""The native engine (``--engine native``) gives HF ``generate``'s completions in fp32 greedy
decoding: unperturbed, low-rank members and full-rank members, on a tiny Llama, a tiny Qwen2
(q/k/v biases, another head layout) and the default model. Finished rows leave its batch without
changing any row's output, and rows that do not fit in memory at once run in waves.

Tolerance: greedy argmax can flip on a near-tie when two engines sum the same products in another
order, so equivalence is asserted at ``AGREEMENT`` of the rows and each test prints its rate.
Every rate measured so far is 1.0: the tiny models here, the default model on 12 Conciseness and
Countdown prompts x 24 tokens, and 64 low-rank rows of Countdown x up to 256 tokens
(``benchmarks.es_speed``'s shapes).
"""

from __future__ import annotations

import copy

import pytest
import torch

import llm_envs
from conftest import build_tiny_model
from trainers import es, lowrank, noise
from trainers.engines import EngineUnavailable, make_engine
from trainers.engines.base import FullRankMember, LowRankMembers
from trainers.engines.native import NativeEngine

AGREEMENT = 0.95
SIGMA = 0.05  # a tiny random model's greedy text must change under the perturbation
PROMPTS = [e.prompt for env in ("Conciseness-v0", "Countdown-v0") for e in llm_envs.make(env).examples("test")[:6]]


def agreement(a, b) -> float:
    assert len(a.token_ids) == len(b.token_ids)
    return sum(x == y for x, y in zip(a.token_ids, b.token_ids)) / len(a.token_ids)


def assert_agree(a, b, what: str) -> None:
    rate = agreement(a, b)
    print(f"{what}: native = hf on {rate:.0%} of {len(a.token_ids)} rows (tolerance {AGREEMENT:.0%})")
    assert rate >= AGREEMENT, f"{what}: only {rate:.0%} of rows agree"
    assert a.prompt_tokens == b.prompt_tokens


def tiny_qwen2(tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(config).eval()
        for p in model.parameters():
            p.data.normal_(0, 0.1)  # biases included: Qwen2's q/k/v biases must matter
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer) if request.param == "llama" else tiny_qwen2(tiny_tokenizer)
    return request.param, model


def test_other_architectures_get_a_one_line_error_naming_the_hf_engine(tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(EngineUnavailable, match="this model is 'gpt2': use --engine hf") as info:
        make_engine("native", model, tiny_tokenizer)
    assert "\n" not in str(info.value)


def test_unperturbed_greedy_completions_equal_hf(tiny, tiny_tokenizer):
    arch, model = tiny
    a = make_engine("hf", model, tiny_tokenizer).generate(PROMPTS, 16)
    b = make_engine("native", model, tiny_tokenizer).generate(PROMPTS, 16)
    assert_agree(a, b, f"{arch} unperturbed")
    assert b.prompt_tokens == a.prompt_tokens and len(set(b.prompt_tokens)) > 1  # left padding exercised


def test_low_rank_members_in_one_call_equal_hf(tiny, tiny_tokenizer):
    arch, model = tiny
    for rank in (1, 5):  # rank 5: the bmm path, above the rank-1 updates
        members = LowRankMembers(lowrank.select_layers(model, None, rank), [1, 1, 2, 3], [1.0, -1.0, 1.0, 1.0],
                                 SIGMA, rank)
        rows = [p for _ in range(4) for p in PROMPTS[:5]]
        hf = make_engine("hf", model, tiny_tokenizer)
        a = hf.generate(rows, 16, perturbation=members)
        b = make_engine("native", model, tiny_tokenizer).generate(rows, 16, perturbation=members)
        assert_agree(a, b, f"{arch} low-rank members, R={rank}")
        plain = hf.generate(rows, 16)
        assert sum(x != y for x, y in zip(a.token_ids, plain.token_ids)) >= len(rows) // 2  # the members moved
        assert a.token_ids[:5] != a.token_ids[5:10]  # a mirrored pair's members differ


def test_low_rank_members_on_some_layers_only(tiny_tokenizer, tiny_model):
    """--param-filter: only the MLP's projections perturbed (the others' groups are skipped)."""
    members = LowRankMembers(lowrank.select_layers(tiny_model, r"mlp\.(up|down)_proj", 2), [4, 5], [1.0, 1.0],
                             SIGMA, 2)
    rows = PROMPTS[:4] * 2
    assert_agree(make_engine("hf", tiny_model, tiny_tokenizer).generate(rows, 12, perturbation=members),
                 make_engine("native", tiny_model, tiny_tokenizer).generate(rows, 12, perturbation=members),
                 "low-rank members on up/down only")


def test_a_full_rank_member_equals_hf_and_the_weights_are_restored_exactly(tiny, tiny_tokenizer):
    arch, model = tiny
    model = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    member = FullRankMember(noise.Params(es.select_params(model, None)), 11, SIGMA, -1.0)
    hf = make_engine("hf", model, tiny_tokenizer)
    a = hf.generate(PROMPTS, 16, perturbation=member)
    b = make_engine("native", model, tiny_tokenizer).generate(PROMPTS, 16, perturbation=member)
    assert_agree(a, b, f"{arch} full-rank member")
    assert agreement(a, hf.generate(PROMPTS, 16)) < 1, "the member changed nothing: the test would prove nothing"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def early_stops(engine: NativeEngine, rows: list, steps: int) -> list[int]:
    """Stop tokens that end some rows early and leave others running: tokens each generated by a
    different row at a different step of an unstopped greedy run."""
    engine.stops = [-1]  # nothing stops
    ids = engine.generate(rows, steps).token_ids
    firsts = {}
    for r, row in enumerate(ids):
        for step, t in enumerate(row[:steps - 2]):
            firsts.setdefault(t, (step, r))
    stops, steps_taken = [], set()
    for t, (step, _) in sorted(firsts.items(), key=lambda kv: kv[1][0]):
        if step > 0 and step not in steps_taken and len(stops) < 3:  # rows ending at different steps
            stops.append(t)
            steps_taken.add(step)
    return stops


def test_finished_rows_leave_the_batch_without_changing_any_output(tiny_model, tiny_tokenizer, monkeypatch):
    rows = PROMPTS[:8]
    plain = NativeEngine(tiny_model, tiny_tokenizer)
    stops = early_stops(plain, rows, 16)
    kept, compacted = NativeEngine(tiny_model, tiny_tokenizer, compact=False), plain
    kept.stops = compacted.stops = stops
    moves = []
    real_move = type(compacted.decoder.cache(1, 1)).move
    monkeypatch.setattr(type(compacted.decoder.cache(1, 1)), "move",
                        lambda self, dst, src, end: moves.append(len(dst)) or real_move(self, dst, src, end))
    a, b = kept.generate(rows, 16), compacted.generate(rows, 16)
    finished = [n for n, done in zip(b.num_tokens, b.finished) if done]
    assert finished and min(finished) < 16 and not all(b.finished), "some rows must end early, others not"
    assert moves, "no row was compacted: the test would prove nothing"
    print(f"rows finished at steps {sorted(finished)}, {sum(moves)} rows moved")
    assert b.token_ids == a.token_ids and b.finished == a.finished  # bit for bit: the same products per row
    members = LowRankMembers(lowrank.select_layers(tiny_model, None, 1), [1, 2], [1.0, -1.0], SIGMA, 1)
    assert (compacted.generate(rows, 16, perturbation=members).token_ids
            == kept.generate(rows, 16, perturbation=members).token_ids)  # members follow their rows when moved


def test_rows_that_do_not_fit_at_once_run_in_waves(tiny_model, tiny_tokenizer, monkeypatch):
    from trainers.engines.native import engine as native

    members = LowRankMembers(lowrank.select_layers(tiny_model, None, 1), [1, 2, 3], [1.0, 1.0, -1.0], SIGMA, 1)
    rows = [p for _ in range(3) for p in PROMPTS[:4]]
    engine = NativeEngine(tiny_model, tiny_tokenizer)
    whole = engine.generate(rows, 12, perturbation=members)
    monkeypatch.setattr(native, "rows_that_fit", lambda model, tokens: 5)
    waves = engine.generate(rows, 12, perturbation=members)
    assert whole.batches == 1 and waves.batches == 3
    assert_agree(whole, waves, "in waves of 5 rows")


def test_sampling_follows_its_seed_and_options(tiny_model, tiny_tokenizer):
    engine = make_engine("native", tiny_model, tiny_tokenizer)
    first = engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=3, num_return_sequences=2)
    assert engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=3, num_return_sequences=2).token_ids == first.token_ids
    assert engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=4, num_return_sequences=2).token_ids != first.token_ids
    assert len(first.texts) == 8 and first.token_ids[0] != first.token_ids[1]  # a prompt's samples differ
    greedy = engine.generate(PROMPTS[:4], 12)
    assert engine.generate(PROMPTS[:4], 12, temperature=0.7, top_k=1, seed=1).token_ids == greedy.token_ids
    assert engine.generate(PROMPTS[:4], 12, temperature=0.7, top_p=1e-6, seed=1).token_ids == greedy.token_ids
    engine.stops = early_stops(engine, PROMPTS[:4], 12)
    assert all(n == 12 for n in engine.generate(PROMPTS[:4], 12, min_new_tokens=12).num_tokens)


def test_progress_is_reported_to_the_end(tiny_model, tiny_tokenizer):
    seen = []
    make_engine("native", tiny_model, tiny_tokenizer).generate(
        PROMPTS[:3], 8, on_progress=lambda done, total, seconds: seen.append((done, total)))
    assert seen[-1] == (3, 3) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


def test_es_runs_on_the_native_engine(tiny_model_dir, tmp_path):
    from test_engines import es_args, log_of

    for mode in ("lowrank", "full"):
        run = tmp_path / mode
        es.main([*es_args(tiny_model_dir, run, "--noise", mode), "--engine", "native"])
        train = [r for r in log_of(run) if "reward_mean" in r]
        assert [r["iteration"] for r in train] == [1, 2, 3]
        assert "engine: native" in (run / "config.yaml").read_text()


def test_grpo_and_eval_run_on_the_native_engine(tiny_model_dir, tmp_path):
    import eval.__main__ as cli
    from test_engines import log_of

    from trainers import grpo

    run = tmp_path / "grpo"
    grpo.main(["--env", "tests.toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(run), "--steps", "2",
               "--batch-size", "2", "--group-size", "4", "--lr", "1e-2", "--max-new-tokens", "6", "--eval-every", "0",
               "--engine", "native"])
    assert [r["iteration"] for r in log_of(run) if "reward_mean" in r] == [1, 2]
    args = ["--env", "Conciseness-v0", "--model", str(tiny_model_dir), "--max-new-tokens", "8",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [hf] = cli.main(args)
    [native] = cli.main([*args, "--engine", "native"])
    assert not native["cached"] and native["engine"] == "native"  # another engine, another cache key
    assert native["pass@1"] == hf["pass@1"] and native["reward_mean"] == hf["reward_mean"]


def test_es_defaults_to_the_native_engine_for_low_rank_noise_where_it_runs(tiny_model, tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainers.config import build_config

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2))
    lowrank_cfg = build_config(es.ESConfig, {"env": "Conciseness-v0", "noise": "lowrank"})
    full_cfg = build_config(es.ESConfig, {"env": "Conciseness-v0"})
    assert lowrank_cfg.engine == full_cfg.engine == "auto"
    assert es.engine_for(lowrank_cfg, tiny_model).engine == "native"
    assert es.engine_for(full_cfg, tiny_model).engine == "hf"
    assert es.engine_for(lowrank_cfg, gpt2).engine == "hf"  # an architecture the native engine does not run
    chosen = build_config(es.ESConfig, {"env": "Conciseness-v0", "noise": "lowrank", "engine": "hf"})
    assert es.engine_for(chosen, tiny_model).engine == "hf"  # an explicit choice stands


@pytest.mark.slow
def test_the_default_model_agrees_with_hf(smollm2):
    model, tokenizer = smollm2
    hf, native = make_engine("hf", model, tokenizer), make_engine("native", model, tokenizer)
    prompts = PROMPTS  # Conciseness and Countdown (with its opening), 12 prompts
    assert_agree(hf.generate(prompts, 24), native.generate(prompts, 24), "SmolLM2 unperturbed")
    member = FullRankMember(noise.Params(es.select_params(model, None)), 9, 2e-3)
    assert_agree(hf.generate(prompts, 24, perturbation=member), native.generate(prompts, 24, perturbation=member),
                 "SmolLM2 full-rank member")
    members = LowRankMembers(lowrank.select_layers(model, None, 1), [1, 2, 3], [1.0, -1.0, 1.0], 2e-3, 1)
    rows = prompts[:4] * 3
    assert_agree(hf.generate(rows, 24, perturbation=members), native.generate(rows, 24, perturbation=members),
                 "SmolLM2 low-rank members")
