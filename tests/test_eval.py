"""The evaluation harness: pass@k, tables from fixture results (golden markdown/LaTeX), KL,
the result cache, the CLI on a tiny in-process model, and plots.

Regenerate the golden files after an intended layout change: ``UPDATE_GOLDEN=1 pytest tests/test_eval.py``.
"""

import copy
import json
import os
from math import comb
from pathlib import Path

import pytest
import torch
import yaml

import eval as harness
import llm_envs
import eval.__main__ as cli
from eval import kl, passk, plot, table
from eval.cache import Cache, cache_key
from llm_envs import Score
from trainers.common.models import load_model as harness_load_model

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
RESULTS = FIXTURES / "results"
RUN = FIXTURES / "runs" / "es-Conciseness-v0-seed0"


# ----- pass@k ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),          # c / n
    (5, 2, 2, 0.7),          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, 0.9),          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 2, 4, 1.0),          # n - c < k: every 4-subset holds a correct sample
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (4, 0, 2, 0.0),
    (4, 4, 1, 1.0),
    (20, 1, 20, 1.0),
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert passk.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_binomial_formula_and_averages_over_problems():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert passk.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    ks = passk.pass_at_ks([[True, False, False], [False, False, False]])
    assert ks == pytest.approx({1: (1 / 3 + 0) / 2, 2: (2 / 3 + 0) / 2, 3: 0.5})
    with pytest.raises(ValueError):
        passk.pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        passk.pass_at_ks([[True], [True, False]])


def test_std_over_seeds_is_the_sample_std():
    """± over a few seeds is the sample std (ddof=1): over 2 seeds {1, 3} it is sqrt(2), not 1."""
    assert passk.mean_std([1.0, 3.0]) == pytest.approx((2.0, 2 ** 0.5))
    assert passk.mean_std([5.0]) == (5.0, 0.0) and passk.mean_std([]) == (0.0, 0.0)
    records = [{"env": "Conciseness-v0", "split": "test", "method": m, "base_model": "b", "hparams": {}, "kl_mean": kl,
                "reward_mean": r, "correct_rate": 0.5, "samples": 2, "temperature": 1.0}
               for m, kl, r in [("Original", 0.0, 0.0), ("ES", 0.1, 1.0), ("ES", 0.3, 3.0)]]
    [t2] = table.conciseness_table(records)
    assert t2.rows[1][4:6] == ["2.000 ± 1.414", "0.200 ± 0.141"]
    assert "sample std" in t2.notes[-1]


# ----- tables ---------------------------------------------------------------------------------------


def _golden(name: str, text: str) -> None:
    path = FIXTURES / "golden" / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; UPDATE_GOLDEN=1 rewrites it"


@pytest.mark.parametrize("fmt, paper, name", [("markdown", False, "tables.md"), ("latex", False, "tables.tex"),
                                              ("csv", False, "tables.csv"), ("markdown", True, "tables_paper.md")])
def test_table_layout_golden(fmt, paper, name):
    records = harness.load_results([str(RESULTS)])
    _golden(name, table.render(table.build(records, "all", paper), fmt))


def test_table1_columns_bold_and_seed_means():
    records = harness.load_results([str(RESULTS / "countdown.summary.json")])
    [t1] = table.method_table(records)
    assert t1.header == ["Base model", "Original", "PPO", "GRPO (8)", "Dr.GRPO", "ES"]  # the paper's order
    smol = t1.rows[0]
    assert smol[0] == "SmolLM2-135M-Instruct (Q4_1 GGUF)" and smol[-1] == "2.3"  # mean of seeds 2.1, 2.5; checkpoint ignored
    assert (0, 5) in t1.bold and (0, 1) not in t1.bold
    assert "13.0" not in t1.rows[1]  # the paper's GRPO-verl only with --paper


def test_table1_flags_cells_measured_differently():
    common = dict(env="Countdown-v0", split="test", base_model="m", samples=1, temperature=0.0, iteration=None)
    records = [dict(common, method="Original", **{"pass@1": 0.50}, n=8, max_new_tokens=48),
               dict(common, method="ES", **{"pass@1": 0.75}, n=8, max_new_tokens=48),
               dict(common, method="GRPO (8)", **{"pass@1": 0.90}, n=8, max_new_tokens=48, source="log"),
               dict(common, method="PPO", **{"pass@1": 0.95}, n=4, max_new_tokens=32)]
    [t1] = table.method_table(records)
    assert t1.header == ["Base model", "Original", "PPO", "GRPO (8)", "ES"]
    assert t1.rows == [["m", "50.0", "95.0†‡", "90.0§", "75.0"]]
    assert t1.bold == {(0, 4)}  # the best comparable cell: ES, not the flagged PPO or GRPO
    assert any(n.startswith("† ") and "(8)" in n and "m PPO: 4" in n for n in t1.notes)
    assert any(n.startswith("‡ ") and "(48)" in n and "m PPO: 32" in n for n in t1.notes)
    assert any(n.startswith("§ ") and "(eval harness)" in n and "m GRPO (8): trainer log" in n for n in t1.notes)
    # the same settings everywhere: nothing flagged
    [same] = table.method_table([dict(r, n=8, max_new_tokens=48, source=None) for r in records])
    assert same.rows == [["m", "50.0", "95.0", "90.0", "75.0"]] and same.bold == {(0, 2)}


def test_trainer_log_records_carry_their_settings():
    records = harness.load_results([str(RUN)])  # a run from before eval_n was logged
    budget = llm_envs.registry.env_class("Conciseness-v0").max_new_tokens
    assert [(r["source"], r["n"], r["max_new_tokens"]) for r in records] == [("log", None, budget)] * 2


def test_table2_flags_reward_hacking():
    records = harness.load_results([str(RESULTS / "conciseness.summary.json")])
    [t2] = table.conciseness_table(records)
    rows = {r[1]: r for r in t2.rows}
    assert rows["GRPO (30)"][4].endswith("*") and rows["GRPO (30)"][7] == "1/2"  # correct 0.10 < 0.5 * 0.60
    assert rows["ES"][4] == "0.910 ± 0.014" and rows["ES"][7] == "0/2"  # 0.90, 0.92: sample std 0.0141
    assert rows["Original"][5] == "0.000"


def test_run_dir_without_results_uses_its_log():
    records = harness.load_results([str(RUN)])
    assert [(r["method"], r["pass@1"]) for r in records] == [("Original", 0.25), ("ES", 0.35)]
    assert all(r["source"] == "log" for r in records)


@pytest.mark.parametrize("config, name, method", [
    ({"population": 30, "sigma": 0.001}, "x", "ES"),
    ({"loss": "grpo", "group_size": 8}, "x", "GRPO (8)"),
    ({"loss_type": "dr_grpo", "group_size": 8}, "x", "Dr.GRPO"),
    ({"algorithm": "PPO"}, "x", "PPO"),
    ({"method": "es", "loss": "grpo"}, "x", "ES"),
    ({}, "grpo-Countdown-v0-2025", "GRPO"),
    ({}, "mystery", "unknown"),
])
def test_method_inferred_from_run_config(config, name, method):
    assert harness.infer_method(config, name) == method


def test_the_default_model_is_labelled_as_what_it_is():
    assert harness.model_name("smollm2-135m") == "SmolLM2-135M-Instruct (Q4_1 GGUF)"
    assert harness.model_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"  # the hub's weights


def test_table_cli(capsys, tmp_path):
    out = tmp_path / "t.tex"
    table.main([str(RESULTS), "--format", "latex", "--table", "1", "--out", str(out)])
    assert r"\textbf{2.3}" in capsys.readouterr().out and out.read_text().startswith(r"\begin{table}")
    with pytest.raises(SystemExit):
        table.main([str(tmp_path / "missing")])
    assert "no such result file" in capsys.readouterr().err


# ----- KL -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampled(tiny_model, tiny_tokenizer):
    """(prompt ids, sampled completion ids) of 6 responses of the tiny model."""
    from trainers.engines.generation import encode_prompts, generate

    prompts = [[{"role": "user", "content": q}] for q in ["What is the capital of France?", "Say 42.", "Sudoku?"]]
    out = generate(tiny_model, tiny_tokenizer, prompts, max_new_tokens=10, temperature=1.0, seed=0, num_return_sequences=2)
    prompt_ids = encode_prompts(tiny_tokenizer, prompts)
    return [prompt_ids[i // 2] for i in range(6)], out.token_ids


def test_kl_of_a_model_against_itself_is_zero_and_positive_for_a_perturbed_copy(tiny_model, tiny_tokenizer, sampled):
    prompts, completions = sampled
    pad = tiny_tokenizer.pad_token_id
    same = kl.response_kl(tiny_model, tiny_model, prompts, completions, batch_size=4, pad_id=pad)
    assert max(abs(v) for v in same) < 1e-6
    other = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    diff = kl.response_kl(other, tiny_model, prompts, completions, batch_size=4, pad_id=pad)
    assert all(v > 0 for v in diff) and sum(diff) / len(diff) > 1e-4


def test_kl_at_another_temperature_uses_the_tempered_distributions(tiny_model, tiny_tokenizer):
    from trainers.engines.generation import encode_prompts, generate

    T = 0.7
    prompts = [[{"role": "user", "content": q}] for q in ["What is the capital of France?", "Say 42."]]
    out = generate(tiny_model, tiny_tokenizer, prompts, max_new_tokens=8, temperature=T, seed=1, num_return_sequences=2)
    prompt_ids = [p for p in encode_prompts(tiny_tokenizer, prompts) for _ in range(2)]
    other = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(3)))
    got = kl.response_kl(other, tiny_model, prompt_ids, out.token_ids, batch_size=3,
                         pad_id=tiny_tokenizer.pad_token_id, temperature=T)
    # directly: unpadded forward passes, softmax(logits / T) of both models, k3 = r - log r - 1 per token
    for value, p, c in zip(got, prompt_ids, out.token_ids):
        with torch.no_grad():
            lm = torch.log_softmax(other(torch.tensor([p + c])).logits[0].double() / T, -1)
            lb = torch.log_softmax(tiny_model(torch.tensor([p + c])).logits[0].double() / T, -1)
        log_r = torch.stack([lb[len(p) - 1 + i, t] - lm[len(p) - 1 + i, t] for i, t in enumerate(c)])
        assert value == pytest.approx(float((log_r.exp() - log_r - 1).mean()), rel=1e-4, abs=1e-7)
    at_one = kl.response_kl(other, tiny_model, prompt_ids, out.token_ids, pad_id=tiny_tokenizer.pad_token_id)
    assert at_one != pytest.approx(got)  # the temperature is really applied


@pytest.mark.parametrize("argv, message", [
    (["--kl-to", "base"], "--kl-to: needs sampled responses (--temperature > 0)"),  # greedy by default
    (["--kl-to", "base", "--samples", "2", "--top-p", "0.9"], "--kl-to: needs --top-p 1"),
])
def test_kl_is_refused_where_k3_does_not_estimate_it(argv, message, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        cli.main([*ARGS, "--model", str(tiny_model_dir), "--cache", "off", *argv])
    assert message in capsys.readouterr().err


def test_token_logprobs_ignore_padding(tiny_model, sampled):
    prompts, completions = sampled
    batched = kl.completion_logprobs(tiny_model, prompts, completions, batch_size=6)
    alone = [kl.completion_logprobs(tiny_model, [p], [c])[0] for p, c in zip(prompts, completions)]
    for a, b, c in zip(batched, alone, completions):
        assert len(a) == len(c) and torch.allclose(a, b, atol=1e-5)
    p, c = prompts[0], completions[0]  # against a plain unpadded forward pass
    with torch.no_grad():
        full = torch.log_softmax(tiny_model(input_ids=torch.tensor([p + c])).logits[0], dim=-1)
    expected = torch.stack([full[len(p) - 1 + i, t] for i, t in enumerate(c)])
    assert torch.allclose(batched[0], expected, atol=1e-5)
    assert float(kl.k3(torch.tensor([-1.0]), torch.tensor([-2.0]))) == pytest.approx(torch.e - 1 - 1)


# ----- the CLI, the cache ---------------------------------------------------------------------------


ARGS = ["--env", "Conciseness-v0", "--max-new-tokens", "6", "--score-workers", "0"]


def forbid_generation(monkeypatch, boom) -> None:
    """Every engine ``--engine auto`` may pick generates by calling ``boom``."""
    monkeypatch.setattr("trainers.engines.hf.HFEngine.generate", boom)
    monkeypatch.setattr("trainers.engines.native.engine.NativeEngine.generate", boom)


def test_cached_results_are_reused_without_generating(tiny_model_dir, tmp_path, monkeypatch, capsys):
    args = [*ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [first] = cli.main(args)
    assert not first["cached"] and first["n"] == 8 and first["method"] == "Original"
    assert "tokens/s" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "out" / "Conciseness-v0.test.greedy.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {"id", "completion", "reward", "correct"} <= set(rows[0])

    def boom(*a, **k):
        raise AssertionError("generate called despite a cached result")

    forbid_generation(monkeypatch, boom)
    monkeypatch.setattr("trainers.common.models.load_model", boom)  # a cached local model is not even loaded
    [second] = cli.main(args)
    assert second["cached"] and second["pass@1"] == first["pass@1"] and second["reward_mean"] == first["reward_mean"]
    monkeypatch.setattr("trainers.common.models.load_model", harness_load_model)
    with pytest.raises(AssertionError, match="generate called"):
        cli.main([*args, "--max-new-tokens", "7"])  # another decoding setting is another key


def test_cached_generations_are_rescored_with_the_current_reward_code(tiny_model_dir, tmp_path, monkeypatch):
    args = [*ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [first] = cli.main(args)

    def boom(*a, **k):
        raise AssertionError("generate called despite a cached result")

    forbid_generation(monkeypatch, boom)
    # a reward fix: the cached texts are scored by the new code, without generating again
    env_class = llm_envs.registry.env_class("Conciseness-v0")
    monkeypatch.setattr(env_class, "score_completion", lambda self, text, example: Score(-len(text) - 0.5, False))
    [second] = cli.main(args)
    assert second["cached"] and second["correct_rate"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "out" / "Conciseness-v0.test.greedy.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [-len(r["completion"]) - 0.5 for r in rows]
    assert second["reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows)) != first["reward_mean"]
    # no reward is stored in the cache at all
    stored = [json.loads(f.read_text()) for f in (tmp_path / "cache").rglob("*.json")]
    assert any("rows" in e for e in stored) and not any("reward" in row for e in stored for row in e.get("rows", []))


def test_another_dtype_misses_the_cache(tiny_model_dir, tmp_path, monkeypatch):
    args = [*ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    [fp32] = cli.main(args)
    assert (fp32["device"], fp32["dtype"]) == ("cpu", "float32")

    def boom(*a, **k):
        raise AssertionError("generate called")

    forbid_generation(monkeypatch, boom)
    assert cli.main([*args, "--dtype", "fp32"])[0]["cached"]  # the same dtype, spelled out: a hit
    with pytest.raises(AssertionError, match="generate called"):
        cli.main([*args, "--dtype", "bf16"])


def test_another_device_misses_the_cache(tiny_model_dir, tmp_path, monkeypatch):
    """GPU generations are never served to a CPU evaluation (or back): the device type is in the key."""
    from eval.harness import LazyModel

    args = [*ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    cli.main(args)
    monkeypatch.setattr(LazyModel, "runtime", property(lambda self: {"device": "cuda", "dtype": "float32"}))
    assert not cli.main(args)[0]["cached"]  # the same weights and dtype on another device: generated anew


def test_default_splits_are_the_envs_eval_splits(tiny_model_dir, tmp_path, monkeypatch):
    env_class = llm_envs.registry.env_class("Conciseness-v0")
    monkeypatch.setattr(env_class, "eval_splits", ("train", "test"))
    results = cli.main([*ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "out"), "--cache", "off"])
    assert [r["split"] for r in results] == ["train", "test"]


def test_cache_key_is_order_independent_and_cache_can_be_off(tmp_path):
    assert cache_key(a=1, b=[1, 2]) == cache_key(b=[1, 2], a=1) != cache_key(a=1, b=[2, 1])
    off = Cache(tmp_path, enabled=False)
    off.put("k" * 32, {"x": 1})
    assert off.get("k" * 32) is None and not any(tmp_path.iterdir())


def test_run_dir_with_samples_pass_at_k_and_kl(tiny_model, tiny_tokenizer, tiny_model_dir, tmp_path):
    from trainers.common.models import save_model

    run = tmp_path / "es-Conciseness-v0-x"
    tuned = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(2)))
    save_model(tuned, tiny_tokenizer, run / "final")
    (run / "config.yaml").write_text(yaml.safe_dump({"env": "Conciseness-v0", "model": str(tiny_model_dir),
                                                     "population": 4, "sigma": 0.05, "alpha": 0.02, "seed": 7}))
    cache = ["--cache", str(tmp_path / "cache")]
    [es] = cli.main([*ARGS, "--model", str(run), "--samples", "3", "--kl-to", "base", "--limit", "4", *cache])
    assert (es["method"], es["base_model"], es["seed"], es["n"], es["responses"]) == ("ES", str(tiny_model_dir), 7, 4, 12)
    assert es["hparams"] == {"alpha": 0.02, "sigma": 0.05} and es["temperature"] == 1.0
    assert set(es["pass@k"]) == {"1", "2", "3"} and es["pass@k"]["1"] <= es["pass@k"]["2"] <= es["pass@k"]["3"]
    assert es["kl_mean"] > 0 and es["file"].startswith(str(run / "eval"))
    assert (es["kl_estimator"], es["kl_temperature"]) == ("k3", 1.0)
    [base] = cli.main([*ARGS, "--model", str(tiny_model_dir), "--samples", "3", "--kl-to", "base", "--limit", "4",
                       "--out", str(tmp_path / "base"), *cache])
    assert base["kl_mean"] == 0.0 and base["method"] == "Original"
    [t2] = table.conciseness_table(harness.load_results([str(run), str(tmp_path / "base")]))
    assert [r[1] for r in t2.rows] == ["Original", "ES"]


@pytest.mark.parametrize("argv, message", [
    (["--env", "Nope-v0"], "unknown env id 'Nope-v0'"),
    (["--split", "validation"], "unknown split 'validation'"),
    (["--samples", "4", "--temperature", "0"], "--samples: needs --temperature > 0"),
    (["--data", "/nonexistent.jsonl"], "--data: no such file"),
    (["--model", "/nonexistent/model"], "no such model or run directory"),
    (["--env-args", "[1]"], "--env-args: must be a JSON object"),
    (["--split", "nope"], "--split: unknown split 'nope'"),
    # options the env checks only when it builds a split (here: too few distinct puzzles for its test split)
    (["--env", "Countdown-v0", "--env-args", '{"min_numbers": 2, "max_numbers": 2, "max_number": 3, "max_target": 10}'],
     "could not generate"),
])
def test_cli_errors_are_one_clear_line(argv, message, tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*ARGS, "--model", str(tiny_model_dir), "--cache", "off", "--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1]  # one line (after argparse's usage for flag errors)


def test_run_dir_without_final_model(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env: Conciseness-v0\nmodel: smollm2-135m\npopulation: 4\nsigma: 0.1\n")
    (run / "log.jsonl").write_text("")
    with pytest.raises(SystemExit):
        cli.main([*ARGS, "--model", str(run), "--cache", "off"])
    assert "has no final/ model yet" in capsys.readouterr().err


# ----- plots ----------------------------------------------------------------------------------------


def test_pareto_front():
    points = [(0.5, 0.8), (0.1, 0.6), (0.3, 0.9), (0.2, 0.5), (0.0, 0.6)]
    assert plot.pareto_front(points) == [(0.0, 0.6), (0.3, 0.9)]


def test_plots_are_written(tmp_path):
    files = plot.main([str(RESULTS), str(RUN), "--out", str(tmp_path)])
    names = sorted(f.name for f in files)
    assert names == ["curves-Conciseness-v0.png", "improvement.png", "pareto-Conciseness-v0-test.png"]
    for f in files:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 10_000
    gains = plot.improvements(harness.load_results([str(RESULTS)]))
    assert gains["Countdown-v0 (test)"]["SmolLM2-135M-Instruct (Q4_1 GGUF)"]["ES"] == pytest.approx(1.9)


def test_the_kl_cache_key_holds_what_changes_the_kl(tmp_path):
    """The KL's forward passes' batch size decides which samples share a pass (the layout): another
    batch size, base dtype or temperature is another key; an evaluation batch that gives the same
    KL batch is the same key."""
    from types import SimpleNamespace

    from eval.cache import Cache
    from eval.harness import measure_kl
    from eval.kl import kl_cache_key

    fp32 = {"device": "cpu", "dtype": "float32"}
    key = kl_cache_key("gen", "base", fp32, 1.0, 8)
    assert key == kl_cache_key("gen", "base", fp32, 1.0, 32)  # both run passes of 8
    assert len({key, kl_cache_key("gen", "base", fp32, 1.0, 4), kl_cache_key("gen", "base", fp32, 0.7, 8),
                kl_cache_key("gen", "base", {"device": "cpu", "dtype": "bfloat16"}, 1.0, 8),
                kl_cache_key("gen", "other", fp32, 1.0, 8), kl_cache_key("other", "base", fp32, 1.0, 8)}) == 6
    # the harness asks for that key: a KL cached at batch size 8 is not served to batch size 4
    cache = Cache(tmp_path)
    cache.put(key, {"kl": [9.0]})
    same = SimpleNamespace(fingerprint="base", runtime=fp32)  # a model against itself: 0 when computed
    entry = {"rows": [{"token_ids": [1]}]}
    cfg = lambda batch: SimpleNamespace(temperature=1.0, batch_size=batch, samples=1)  # noqa: E731
    assert measure_kl(same, same, [], entry, "gen", cfg(8), cache) == [9.0]
    assert measure_kl(same, same, [], entry, "gen", cfg(4), cache) == [0.0]


def test_a_run_is_measured_on_the_env_it_trained_on(tiny_model, tiny_tokenizer, tiny_model_dir, tmp_path):
    """Without --env, a trainer run is evaluated on its own env and --env-args (config.yaml), not the default."""
    from trainers.common.models import save_model

    run = tmp_path / "grpo-letter"
    save_model(tiny_model, tiny_tokenizer, run / "final")
    (run / "config.yaml").write_text(yaml.safe_dump({"env": "Conciseness-v0", "env_args": '{"seed": 3}',
                                                     "model": str(tiny_model_dir), "algorithm": "grpo", "seed": 0}))
    args = ["--model", str(run), "--max-new-tokens", "4", "--score-workers", "0", "--limit", "2", "--cache", "off"]
    [trained] = cli.main(args)
    assert (trained["env"], trained["env_args"]) == ("Conciseness-v0", {"seed": 3})
    [other] = cli.main([*args, "--env", "Conciseness-v0", "--out", str(tmp_path / "other")])
    assert other["env_args"] == {}  # --env given: its own --env-args (none), not the run's
    [plain] = cli.main(["--model", str(tiny_model_dir), "--max-new-tokens", "4", "--limit", "1", "--cache", "off",
                        "--out", str(tmp_path / "plain")])
    assert plain["env"] == "Countdown-v0"  # not a run: the default env
