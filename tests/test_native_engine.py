"""The native engine (``--engine native``) gives HF ``generate``'s completions in fp32 greedy
decoding: unperturbed, low-rank members and full-rank members, on a tiny Llama, a tiny Qwen2
(q/k/v biases, another head layout) and the default model. Finished rows leave its batch without
changing any row's output, and rows that do not fit in memory at once run in waves.

Tolerance: greedy argmax can flip on a near-tie when two engines sum the same products in another
order, so equivalence is asserted at ``test_engines.AGREEMENT`` (95%) of the rows and each test
prints its rate.
Every rate measured so far is 1.0: the tiny models here, the default model on 12 Conciseness and
Countdown prompts x 24 tokens, and 64 low-rank rows of Countdown x up to 256 tokens
(``benchmarks.speed.es``'s shapes).
"""

from __future__ import annotations

import copy

import pytest
import torch

import test_engines as shared
from conftest import build_tiny_model, build_tiny_qwen2
from test_engines import PROMPTS, SIGMA, agreement, es_args, log_of
from trainers.es import train as es
from trainers.engines import EngineUnavailable, make_engine
from trainers.engines.generation import WaveRoom
from trainers.engines.native import NativeEngine, static
from trainers.engines.native.engine import cut_waves
from trainers.es.noise import fullrank, lowrank
from trainers.es.noise.members import FullRankMember, LowRankMembers

def assert_agree(a, b, what: str) -> None:
    shared.assert_agree(a, b, what, "native")
    assert a.prompt_tokens == b.prompt_tokens


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer) if request.param == "llama" else build_tiny_qwen2(tiny_tokenizer)
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
    member = FullRankMember(fullrank.Params(es.select_params(model, None)), 11, SIGMA, -1.0)
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


def room_of(cap: int):
    """A stand-in for ``wave_room``: room for ``cap`` slots, whatever their prompts (no prefill cost)."""
    return lambda model, tokens: WaveRoom(room=cap, kept=1, prefill=0)


def test_rows_that_do_not_fit_at_once_run_in_waves(tiny_model, tiny_tokenizer, monkeypatch):
    from trainers.engines.native import engine as native

    members = LowRankMembers(lowrank.select_layers(tiny_model, None, 1), [1, 2, 3], [1.0, 1.0, -1.0], SIGMA, 1)
    rows = [p for _ in range(3) for p in PROMPTS[:4]]
    engine = NativeEngine(tiny_model, tiny_tokenizer)
    whole = engine.generate(rows, 12, perturbation=members)
    monkeypatch.setattr(native, "wave_room", room_of(5))
    waves = engine.generate(rows, 12, perturbation=members)
    assert whole.batches == 1 and waves.batches == 3
    assert_agree(whole, waves, "in waves of 5 rows")


def test_waves_count_a_shared_prompts_prefill_once():
    """``cut_waves``: slots each cost ``kept``, distinct keys ``prefill`` (and a bucket's empty rows
    one more). A full row costs 7 of 10, so rows alone go one per wave; a group of 4 of one prompt
    (4 x 1 + 6) fits in one."""
    room = WaveRoom(room=10, kept=1, prefill=6)
    assert cut_waves(list(range(3)), ["a", "b", "c"], room) == [[0], [1], [2]]
    assert cut_waves(list(range(8)), ["a"] * 4 + ["b"] * 4, room) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cut_waves(list(range(5)), ["a"] * 5, room) == [[0, 1, 2, 3], [4]]
    # in buckets: 3 rows take 4 slots and prefill an empty row too (4 + 2 x 6 > 10)
    assert cut_waves(list(range(3)), ["a"] * 3, room, static.bucket) == [[0, 1], [2]]
    assert cut_waves(list(range(4)), ["a"] * 4, room, static.bucket) == [[0, 1, 2, 3]]  # 3 rows do not fit, 4 do
    assert cut_waves([0], ["a"], WaveRoom(room=0, kept=1, prefill=1)) == [[0]]  # never an empty wave


@pytest.mark.parametrize("fixed", [False, True], ids=["compacting", "fixed-shapes"])
def test_a_group_that_fits_once_its_prompt_is_shared_runs_in_one_wave(tiny_model, tiny_tokenizer, monkeypatch, fixed):
    """Where memory holds one row with its own prompt pass (ARC-AGI's 10k-token prompts on a CPU),
    a group of responses still runs together: its prompt's scores are computed once. The samples
    are those of one row per wave."""
    from trainers.engines.native import engine as native

    engine = NativeEngine(tiny_model, tiny_tokenizer, fixed_shapes=fixed)
    monkeypatch.setattr(native, "wave_room", room_of(1))
    alone = engine.generate(PROMPTS[:2], 12, temperature=1.0, seed=5, num_return_sequences=4)
    monkeypatch.setattr(native, "wave_room", lambda model, tokens: WaveRoom(room=10, kept=1, prefill=6))
    grouped = engine.generate(PROMPTS[:2], 12, temperature=1.0, seed=5, num_return_sequences=4)
    assert alone.batches == 8 and grouped.batches == 2
    assert grouped.token_ids == alone.token_ids


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


def test_a_rows_sample_depends_on_its_seed_alone_not_on_the_waves(tiny_model, tiny_tokenizer, monkeypatch):
    """Waves are sized from free memory; each row draws from its own stream, so caps of 1, 7, 16
    and none give the same 24 samples (with one generator across waves, none of them did)."""
    from trainers.engines.native import engine as native

    rows = [p for _ in range(6) for p in PROMPTS[:4]]
    engine = NativeEngine(tiny_model, tiny_tokenizer)
    whole = engine.generate(rows, 12, temperature=1.0, seed=1)
    assert whole.batches == 1 and len({tuple(ids) for ids in whole.token_ids}) > 4
    for cap in (1, 7, 16):
        monkeypatch.setattr(native, "wave_room", room_of(cap))
        waves = engine.generate(rows, 12, temperature=1.0, seed=1)
        assert waves.batches == -(-len(rows) // cap)
        assert waves.token_ids == whole.token_ids, f"waves of {cap} rows"


def test_a_rows_sample_does_not_depend_on_its_neighbours(tiny_model, tiny_tokenizer):
    """Explicit seeds, one per row: a row gives the same sample alone or among others, in any
    position, and the same seeds give hf's samples (both engines sample in engines/sampling.py)."""
    engine = NativeEngine(tiny_model, tiny_tokenizer)
    seeds = [11, 12, 13, 14]
    together = engine.generate(PROMPTS[:4], 12, temperature=1.0, seed=seeds)
    alone = [engine.generate([PROMPTS[k]], 12, temperature=1.0, seed=[seeds[k]]).token_ids[0] for k in range(4)]
    assert together.token_ids == alone
    reversed_ = engine.generate(PROMPTS[:4][::-1], 12, temperature=1.0, seed=seeds[::-1])
    assert reversed_.token_ids[::-1] == together.token_ids
    hf = make_engine("hf", tiny_model, tiny_tokenizer).generate(PROMPTS[:4], 12, temperature=1.0, seed=seeds)
    shared.assert_agree(hf, together, "sampled with the same row seeds", "native")


@pytest.mark.parametrize("fixed", [False, True], ids=["compacting", "fixed-shapes"])
def test_a_groups_responses_share_one_prefill_of_their_prompt(tiny_model, tiny_tokenizer, monkeypatch, fixed):
    """An RL group (``num_return_sequences``) prefills its prompt once and copies its keys and values
    to each response: the prefill sees each distinct (prompt, member) once, and every sample equals
    the one prefilled on its own row. Rows of one prompt under two low-rank members are not shared."""
    from trainers.engines.native import engine as native, model as decoder_module, static

    prefilled = []
    forward = decoder_module.Decoder.forward
    monkeypatch.setattr(decoder_module.Decoder, "forward", lambda self, ids, *a, **k: (
        prefilled.append(ids.shape[0]) if ids.shape[1] > 1 else None, forward(self, ids, *a, **k))[1])
    engine = NativeEngine(tiny_model, tiny_tokenizer, fixed_shapes=fixed)
    members = LowRankMembers(lowrank.select_layers(tiny_model, None, 1), [1, 2], [1.0, 1.0], SIGMA, 1)
    calls = {"group": dict(prompts=PROMPTS[:4], num_return_sequences=3),
             "members": dict(prompts=[p for _ in range(2) for p in PROMPTS[:2] for _ in range(2)], perturbation=members)}
    shared_ = {}
    for name, kw in calls.items():
        prefilled.clear()
        shared_[name] = engine.generate(max_new_tokens=12, temperature=1.0, seed=5, **kw).token_ids
        padding = 1 if fixed and name == "group" else 0  # the empty rows filling the fixed shape's bucket
        assert prefilled == [4 + padding], name  # 4 prompts; 2 prompts x 2 members
    for where in (native, static):
        monkeypatch.setattr(where, "shared_prefill", decoder_module.prefill)  # every row its own prompt pass
    for name, kw in calls.items():
        prefilled.clear()
        assert engine.generate(max_new_tokens=12, temperature=1.0, seed=5, **kw).token_ids == shared_[name], name
        assert prefilled == [len(shared_[name]) if not fixed else static.bucket(len(shared_[name]))]
    assert len({tuple(t) for t in shared_["group"][:3]}) > 1  # a group's samples still differ


def test_progress_is_reported_to_the_end(tiny_model, tiny_tokenizer):
    seen = []
    make_engine("native", tiny_model, tiny_tokenizer).generate(
        PROMPTS[:3], 8, on_progress=lambda done, total, seconds: seen.append((done, total)))
    assert seen[-1] == (3, 3) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


def test_es_runs_on_the_native_engine(tiny_model_dir, tmp_path):
    sampled = ["--temperature", "1", "--samples-per-prompt", "2"]
    for mode, extra in (("lowrank", []), ("full", []), ("lowrank", sampled), ("full", sampled)):
        run = tmp_path / f"{mode}-{len(extra)}"
        es.main([*es_args(tiny_model_dir, run, "--noise", mode, *extra), "--engine", "native"])
        train = [r for r in log_of(run) if "reward_mean" in r]
        assert [r["iteration"] for r in train] == [1, 2, 3]
        assert "engine: native" in (run / "config.yaml").read_text()
        assert train[-1]["samples"] == 3 * 4 * 2 * (2 if extra else 1)


def test_grpo_and_eval_run_on_the_native_engine(tiny_model_dir, tmp_path):
    import eval.__main__ as cli
    from trainers.rl import grpo

    run = tmp_path / "grpo"
    grpo.main(["--env", "tests.toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(run), "--steps", "2",
               "--batch-size", "2", "--group-size", "4", "--lr", "1e-2", "--max-new-tokens", "6", "--eval-every", "0",
               "--engine", "native"])
    assert [r["iteration"] for r in log_of(run) if "reward_mean" in r] == [1, 2]
    args = ["--env", "Conciseness-v0", "--model", str(tiny_model_dir), "--max-new-tokens", "8",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [hf] = cli.main([*args, "--engine", "hf"])  # a plain model's default, auto, is native here
    [native] = cli.main([*args, "--engine", "native"])
    assert not native["cached"] and native["engine"] == "native"  # another engine, another cache key
    assert native["pass@1"] == hf["pass@1"] and native["reward_mean"] == hf["reward_mean"]
    # on a run directory the harness generates with the engine the run recorded, unless told otherwise
    run_args = ["--env", "tests.toy_envs:Letter-v0", "--model", str(run), "--max-new-tokens", "6",
                "--out", str(tmp_path / "run-out"), "--cache", str(tmp_path / "cache")]
    [own] = cli.main(run_args)
    [told] = cli.main([*run_args, "--engine", "hf"])
    assert own["engine"] == "native" and told["engine"] == "hf"
    assert own["pass@1"] == [r for r in log_of(run) if "eval_pass@1" in r][-1]["eval_pass@1"]


@pytest.mark.slow
def test_the_default_model_agrees_with_hf(smollm2):
    model, tokenizer = smollm2
    hf, native = make_engine("hf", model, tokenizer), make_engine("native", model, tokenizer)
    prompts = PROMPTS  # Conciseness and Countdown (with its opening), 12 prompts
    assert_agree(hf.generate(prompts, 24), native.generate(prompts, 24), "SmolLM2 unperturbed")
    member = FullRankMember(fullrank.Params(es.select_params(model, None)), 9, 2e-3)
    assert_agree(hf.generate(prompts, 24, perturbation=member), native.generate(prompts, 24, perturbation=member),
                 "SmolLM2 full-rank member")
    members = LowRankMembers(lowrank.select_layers(model, None, 1), [1, 2, 3], [1.0, -1.0, 1.0], 2e-3, 1)
    rows = prompts[:4] * 3
    assert_agree(hf.generate(rows, 24, perturbation=members), native.generate(rows, 24, perturbation=members),
                 "SmolLM2 low-rank members")
