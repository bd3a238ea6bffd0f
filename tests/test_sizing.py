"""Sized to the machine (``trainers/common/sizing.py``): ``--preset auto`` keeps the paper's size unless
an iteration (step) of it would take over ~2 h here, then takes the env's CPU preset; ``--preset
paper`` / ``cpu`` ask for one; an explicit flag or ``--config`` value always wins, and config.yaml
records where each value came from; every trainer says its whole-run estimate before its first work,
and the probe behind it leaves the run's numbers as they were."""

import dataclasses
import json

import llm_envs
import pytest
import torch
import yaml
from safetensors.torch import load_file

from trainers.common import sizing
from trainers.common.config import to_dict
from trainers.es import presets as es_presets
from trainers.es import train as es
from trainers.rl import grpo, ppo
from trainers.rl import presets as rl_presets

PACE = sizing.Pace("cpu", rows=4, prompt_tokens=100, prompt_seconds=2.0, step_seconds=0.1, member_seconds=1.0, seconds=3.0)


def es_choice(argv, seconds_per_member_row: float = 1.0):
    """``--preset`` decided for ES on ``argv`` with a made-up pace: an iteration takes
    ``seconds_per_member_row`` per member and prompt."""
    cfg = es.resolve(argv)
    env = llm_envs.make(cfg.env)
    cfg.max_new_tokens = cfg.max_new_tokens or env.max_new_tokens  # as train() sets it first
    train = len(env.examples("train"))
    prompts = lambda c: min(c.batch_size or train, train)  # noqa: E731
    choice = sizing.choose_preset(cfg, es_presets.es_cpu_preset(env, llm_envs.registry.resolve_id(cfg.env)),
                           lambda c: f"N={c.population} x {prompts(c)} prompts",
                           lambda c: c.population * prompts(c),
                           lambda c: seconds_per_member_row * c.population * prompts(c), "iteration", PACE)
    return cfg, choice


def test_sudoku_alone_takes_the_cpu_preset_where_the_papers_iteration_is_too_long():
    cfg, choice = es_choice(["--env", "Sudoku-v0"])  # 32 members x 800 prompts x 1 s: ~7 h per iteration
    assert choice.name == cfg.preset == "cpu"
    assert (cfg.population, cfg.mirrored, cfg.batch_size, cfg.max_new_tokens, cfg.iterations, cfg.eval_limit) == \
           (8, True, 4, 256, 20, 20)
    sources = to_dict(cfg)["sources"]
    assert sources["population"] == sources["max_new_tokens"] == "preset cpu" and sources["env"] == "flag"
    line = choice.line("ES", cfg.env, cfg.iterations, 20, 3, 60.0)
    assert "the CPU preset (the paper's would take ~7.1 h per iteration on this device: N=32 x 800 prompts; " \
           "--preset paper asks for it)" in line
    assert "32 completions of up to 256 tokens (8,192 tokens) per iteration, 20 iterations" in line
    assert "--preset paper (N=32 x 800 prompts, 512 new tokens, 2500 iterations" in line and "4 rows" in line


def test_the_paper_preset_is_kept_where_its_iteration_fits():
    cfg, choice = es_choice(["--env", "Sudoku-v0"], seconds_per_member_row=0.2)  # ~1.4 h per iteration
    assert choice.name == cfg.preset == "paper" and (cfg.population, cfg.batch_size, cfg.iterations) == (32, None, 2500)
    assert to_dict(cfg)["sources"]["population"] == "preset paper"
    assert "a smaller preset: --preset cpu (N=8 x 4 prompts, 256 new tokens, 20 iterations" in \
           choice.line("ES", cfg.env, 2500, 200, 26, 600.0)


@pytest.mark.parametrize("flag, seconds, name, population", [("paper", 1.0, "paper", 32), ("cpu", 0.001, "cpu", 8)])
def test_preset_asks_for_one_whatever_the_estimate(flag, seconds, name, population):
    cfg, choice = es_choice(["--env", "Sudoku-v0", "--preset", flag], seconds)
    assert (choice.name, cfg.population) == (name, population) and f"(--preset {flag})" in choice.line("ES", "x", 1, 1, 0, 0)


def test_explicit_flags_and_config_values_win_over_the_preset(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("env: Sudoku-v0\nmax_new_tokens: 64\n")
    cfg, choice = es_choice(["--config", str(config), "--population", "16", "--iterations", "3"])
    assert choice.name == "cpu" and (cfg.population, cfg.iterations, cfg.max_new_tokens, cfg.batch_size) == (16, 3, 64, 4)
    sources = to_dict(cfg)["sources"]
    assert (sources["population"], sources["max_new_tokens"], sources["batch_size"]) == ("flag", "--config file",
                                                                                         "preset cpu")
    assert "with your population, iterations, max-new-tokens" in choice.line("ES", "x", 1, 1, 0, 0)


def test_the_main_jobs_config_keeps_every_value(tmp_path):
    """README's main job: every size it sets is its own, whatever the estimate says."""
    cfg, choice = es_choice(["--config", "benchmarks/configs/es_conciseness_cpu.yaml"], seconds_per_member_row=1e6)
    before = {k: v for k, v in to_dict(cfg).items() if k not in ("preset", "sources")}
    assert choice.applied == {} and "the values given (flags, --config)" in choice.line("ES", "x", 8, 8, 3, 1.0)
    assert (cfg.population, cfg.iterations, cfg.sigma, cfg.alpha, cfg.max_new_tokens, cfg.mirrored) == \
           (8, 8, 5e-4, 1.5e-3, 48, True)
    assert before == {k: v for k, v in to_dict(cfg).items() if k not in ("preset", "sources")}


def test_a_resumed_run_keeps_its_values(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg, _ = es_choice(["--env", "Sudoku-v0", "--out", str(run)])
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    resumed, choice = es_choice(["--resume", str(run), "--iterations", "30"], seconds_per_member_row=1e-6)
    assert choice.applied == {} and (resumed.population, resumed.iterations, resumed.preset) == (8, 30, "cpu")
    sources = to_dict(resumed)["sources"]
    assert sources["population"] == "preset cpu" and sources["iterations"] == "flag (at --resume)"


@pytest.mark.parametrize("trainer, family", [(grpo, "grpo"), (ppo, "ppo")])
def test_rl_trainers_have_cpu_presets_too(trainer, family):
    cfg = trainer.resolve(["--env", "Countdown-v0", "--batch-size", "4"])
    env = llm_envs.make(cfg.env)
    cfg.max_new_tokens = env.max_new_tokens
    choice = sizing.choose_preset(cfg, rl_presets.rl_cpu_preset(env, "Countdown-v0", family), str, lambda c: 1,
                           lambda c: 1e9 if c.max_new_tokens == 512 else 60.0, "step", PACE, units="steps")
    expected = rl_presets.CPU_FAMILY[family]
    assert choice.name == "cpu" and (cfg.group_size, cfg.lr, cfg.steps, cfg.max_new_tokens, cfg.eval_limit) == \
           (expected["group_size"], 1e-5, 20, 256, 20)
    assert cfg.batch_size == 4 and to_dict(cfg)["sources"]["lr"] == "preset cpu"


def test_an_rl_step_costs_its_sampling_and_its_update():
    cfg = ppo.resolve(["--env", "Countdown-v0"])
    shared = ppo.resolve(["--env", "Countdown-v0", "--shared-critic", "true", "--epochs", "2"])
    assert rl_presets.update_passes(cfg) == 3 + 1 + 1 + 3  # policy, reference, critic's values and training
    assert rl_presets.update_passes(shared) == 6 + 1 + 1 + 1  # two epochs, reference, old log-probs, values
    assert rl_presets.update_passes(grpo.resolve(["--loss", "dr_grpo"])) == 3  # beta 0: no reference
    recomputed = ppo.resolve(["--env", "Countdown-v0", "--gradient-checkpointing", "true"])
    assert rl_presets.update_passes(recomputed) == 4 + 1 + 1 + 4  # each trained forward once more


@pytest.mark.parametrize("family", ["grpo", "ppo"])
def test_arc_agis_rl_preset_bounds_the_updates_memory(family):
    """ARC-AGI-v0's 10,000-token prompts: activations recomputed, micro-batches capped by tokens."""
    preset = rl_presets.rl_cpu_preset(llm_envs.make("ARC-AGI-v0"), "ARC-AGI-v0", family)
    assert preset["gradient_checkpointing"] is True and preset["micro_batch_tokens"] == 8192



@pytest.mark.parametrize("trainer", [grpo, ppo])
def test_a_preset_that_turns_on_checkpointing_recomputes_the_update(trainer, tiny_model_dir, tmp_path, monkeypatch):
    """The preset is chosen after the policy is loaded (from a probe of its engine): its
    ``gradient_checkpointing`` must still reach the policy (and PPO's critic), not only the record.
    ARC-AGI-v0's first checkpointed GRPO step ran without it and peaked at 22 GB."""
    monkeypatch.setitem(rl_presets.CPU_PRESETS, "Conciseness-v0", dict(gradient_checkpointing=True))
    seen = []
    for module in (grpo, ppo):
        real = module.token_logprobs

        def spy(model, batch, *a, _real=real, **k):
            if torch.is_grad_enabled():
                seen.append(model.is_gradient_checkpointing)
            return _real(model, batch, *a, **k)
        monkeypatch.setattr(module, "token_logprobs", spy)
    real_states = ppo.completion_states

    def states_spy(trunk, batch):
        if torch.is_grad_enabled():
            seen.append(trunk.is_gradient_checkpointing)
        return real_states(trunk, batch)
    monkeypatch.setattr(ppo, "completion_states", states_spy)
    run = tmp_path / "run"
    trainer.main(run_args(tiny_model_dir, run, "--steps", "1", "--batch-size", "1", "--group-size", "2",
                          "--preset", "cpu"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["gradient_checkpointing"] is True and config["sources"]["gradient_checkpointing"] == "preset cpu"
    assert seen and all(seen), seen  # every trained forward recomputes its activations


def test_a_pace_scales_with_rows_and_tokens():
    assert PACE.generation(8, 11) == pytest.approx(2 * (2.0 + 10 * 0.1))
    assert PACE.generation(0, 100) == 0.0
    assert PACE.forward(400) == pytest.approx(2.0)  # the probe's 4 x 100 prompt tokens took 2 s
    assert PACE.generation(8, 11, prompts=2) == PACE.generation(8, 11)  # an engine that does not share prompts


def test_a_group_of_responses_is_paced_with_its_prompt_computed_once():
    """On an engine that shares a prompt among its rows (native), 2 prompts x 4 responses cost two
    prompt passes and eight rows' decoding; a probe whose 4 rows held 2 distinct prompts computed 2."""
    shared = dataclasses.replace(PACE, prompt_rows=4, shares_prompts=True)
    assert shared.generation(8, 11, prompts=2) == pytest.approx(2 / 4 * 2.0 + 8 / 4 * 10 * 0.1)
    assert shared.generation(8, 11) == PACE.generation(8, 11)  # every row its own prompt
    repeated = dataclasses.replace(shared, prompt_rows=2)
    assert repeated.generation(8, 11, prompts=2) == pytest.approx(2 / 2 * 2.0 + 8 / 4 * 10 * 0.1)
    assert repeated.forward(200) == pytest.approx(2.0)  # 2 prompts x 100 tokens took the 2 s



def test_a_held_out_evaluation_is_paced_from_its_own_prompts_padded_per_wave():
    def prompts(*lengths):  # distinct prompts of these lengths
        return [[k] * n for k, n in enumerate(lengths)]

    # prompts of the probe's length: the same as four responses' generation
    assert PACE.evaluation(prompts(100, 100, 100, 100), 11, batch=32) == pytest.approx(PACE.generation(4, 11))
    # ARC-AGI-v0's case: one wave padded to its longest prompt, 3 x 700 tokens of prompt pass
    assert PACE.evaluation(prompts(700, 100, 100), 11, batch=32) == pytest.approx(3 * 700 / 400 * 2.0 + 3 / 4 * 10 * 0.1)
    # waves of 2, longest together: 2 x 700 + 1 x 100 tokens
    assert PACE.evaluation(prompts(100, 700, 600), 1, batch=2) == pytest.approx((2 * 700 + 100) / 400 * 2.0)


def test_a_held_out_evaluations_repeated_prompts_are_paced_once_per_wave_where_the_engine_shares_them():
    repeated = [[1] * 100, [2] * 100, [1] * 100, [1] * 100]  # two distinct prompts, one of them three times
    shared = dataclasses.replace(PACE, shares_prompts=True)
    decode = 4 / 4 * 10 * 0.1
    assert shared.evaluation(repeated, 11, batch=32) == pytest.approx(2 * 100 / 400 * 2.0 + decode)
    assert PACE.evaluation(repeated, 11, batch=32) == pytest.approx(4 * 100 / 400 * 2.0 + decode)  # every row's
    # a wave shares only its own rows: waves of 2 (stable order: 1, 2 | 1, 1) compute 2 + 1 prompts
    assert shared.evaluation(repeated, 11, batch=2) == pytest.approx(3 * 100 / 400 * 2.0 + decode)


class SlowPromptEngine:
    """A stand-in engine: the first calls' prompt pass takes 0.4 s, later ones 0.05 s (the noise of a
    long prompt's pass), and every further token 0.02 s; ``per_token``: it reports after each token
    (hf, native), else only when the call's rows finish (vLLM)."""

    def __init__(self, per_token: bool, shares_prompts: bool = False):
        self.per_token, self.calls, self.tokenizer = per_token, 0, None
        self.shares_prompts = shares_prompts

    def generate(self, prompts, max_new_tokens, on_progress=None, **kwargs):
        import time

        self.calls += 1
        time.sleep(0.4 if self.calls <= 2 else 0.05)  # the prompt pass, with its first token
        for token in range(1, max_new_tokens + 1):
            if token > 1:
                time.sleep(0.02)
            if on_progress is not None and self.per_token:
                on_progress(len(prompts) * token / max_new_tokens, len(prompts), 0.0)
        if on_progress is not None:
            on_progress(len(prompts), len(prompts), 0.0)


@pytest.mark.parametrize("per_token", [True, False])
def test_the_probe_times_tokens_apart_from_the_prompt_pass(per_token, monkeypatch):
    """A further token's time comes from the progress reports between the first token and the last,
    so a prompt pass that ran faster in the second call does not make tokens free (ARC-AGI-v0's long
    prompts read 0 ms per token before); an engine without per-token reports falls back to the
    difference of the two calls, which reads 0 here."""
    monkeypatch.setattr("trainers.engines.generation.encode_prompts", lambda tokenizer, batch: [[0] * 10 for _ in batch])
    pace = sizing.probe_pace(SlowPromptEngine(per_token), ["p"], "cpu", rows=2)
    if per_token:
        assert 0.015 <= pace.step_seconds <= 0.1
    else:
        assert pace.step_seconds == 0.0
    assert pace.prompt_seconds >= 0.4 and pace.prompt_tokens == 10
    assert pace.prompt_rows == 2  # two rows, each its own prompt pass


def test_the_probe_counts_the_prompts_a_sharing_engine_computed(monkeypatch):
    """Conciseness-v0 trains on 2 prompts: a probe of 4 rows cycles them, and an engine that shares
    a prompt among rows computes 2 of them, so its pass is paced per distinct prompt."""
    monkeypatch.setattr("trainers.engines.generation.encode_prompts",
                        lambda tokenizer, batch: [[ord(p)] * 10 for p in batch])
    pace = sizing.probe_pace(SlowPromptEngine(True, shares_prompts=True), ["a", "b"], "cpu", rows=4)
    assert pace.rows == 4 and pace.prompt_rows == 2 and pace.shares_prompts
    assert sizing.probe_pace(SlowPromptEngine(True), ["a", "b"], "cpu", rows=4).prompt_rows == 4


def run_args(model_dir, out, *extra):
    return ["--env", "Conciseness-v0", "--model", str(model_dir), "--out", str(out), "--max-new-tokens", "4",
            "--eval-limit", "2", "--seed", "1", *extra]


@pytest.mark.parametrize("trainer, extra", [
    (es, ["--iterations", "1", "--population", "4", "--sigma", "0.05", "--alpha", "0.02"]),
    (grpo, ["--steps", "1", "--batch-size", "2", "--group-size", "2"]),
    (ppo, ["--steps", "1", "--batch-size", "2", "--group-size", "2"]),
])
def test_every_trainer_says_its_estimate_before_its_first_work(trainer, extra, tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    trainer.main(run_args(tiny_model_dir, run, *extra))
    lines = capsys.readouterr().out.splitlines()
    estimate = next(i for i, line in enumerate(lines) if "completions of up to 4 tokens" in line)
    first_work = next(i for i, line in enumerate(lines) if "held-out" in line and i != estimate)
    assert estimate < first_work and "estimated ~" in lines[estimate] and "probe on this cpu" in lines[estimate]
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["preset"] == "paper" and config["sources"]["max_new_tokens"] == "flag"


def test_auto_runs_the_cpu_preset_where_the_paper_is_too_slow(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sizing, "SWITCH", 0.0)  # every iteration is "too long" on this machine
    run = tmp_path / "run"
    es.main(run_args(tiny_model_dir, run, "--iterations", "1"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["preset"], config["population"], config["mirrored"], config["sigma"]) == ("cpu", 8, True, 5e-4)
    assert (config["iterations"], config["max_new_tokens"]) == (1, 4)  # the flags'
    assert config["sources"]["population"] == "preset cpu" and config["sources"]["iterations"] == "flag"
    assert "the CPU preset with your iterations, max-new-tokens (the paper's would take ~" in \
           capsys.readouterr().out
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in log if "reward_mean" in r] == [16]  # N=8 x 2 prompts ran



def test_max_samples_is_checked_against_the_chosen_presets_iteration(tiny_model_dir, tmp_path, monkeypatch):
    """`--max-samples` that one CPU-preset iteration fits is not refused with the paper's size (the
    preset is chosen after the probe); one that even the chosen size exceeds still is."""
    monkeypatch.setattr(sizing, "SWITCH", 0.0)  # auto picks the CPU preset: N=8 x 2 prompts = 16
    run = tmp_path / "run"
    es.main(run_args(tiny_model_dir, run, "--iterations", "1", "--max-samples", "16"))
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in log if "reward_mean" in r] == [16]
    with pytest.raises(es.ConfigError, match=r"--max-samples 8 is less than one iteration: N=8 x 2 prompts"):
        es.train(es.resolve(run_args(tiny_model_dir, tmp_path / "small", "--iterations", "1", "--max-samples", "8")))
    with pytest.raises(es.ConfigError, match=r"--max-samples 16 is less than one iteration: N=30 x 2"):
        es.train(es.resolve(run_args(tiny_model_dir, tmp_path / "paper", "--preset", "paper", "--max-samples", "16")))
    assert not (tmp_path / "paper").exists()  # refused before any run directory or model load


def test_rl_max_samples_is_checked_against_the_chosen_presets_batch(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(rl_presets.CPU_PRESETS, "Conciseness-v0", dict(group_size=2))  # 2 prompts x 2
    run = tmp_path / "run"
    grpo.main(run_args(tiny_model_dir, run, "--steps", "1", "--preset", "cpu", "--max-samples", "4"))
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in log if "reward_mean" in r] == [4]
    with pytest.raises(es.ConfigError, match=r"--max-samples 4 is less than one sampled batch: 2 prompts x 8"):
        grpo.train(grpo.resolve(run_args(tiny_model_dir, tmp_path / "paper", "--preset", "paper", "--max-samples", "4")))

@pytest.mark.parametrize("engine", ["native", "hf"])  # hf: the README's main job's
def test_the_probe_leaves_the_runs_numbers_as_they_were(engine, tiny_model_dir, tmp_path, monkeypatch):
    """The same full-rank ES run with the probe (which generates under a perturbed member) and with a
    made-up pace instead ends with the same weights, bit for bit."""
    args = ["--iterations", "2", "--population", "4", "--sigma", "0.05", "--alpha", "0.02", "--engine", engine]
    es.main(run_args(tiny_model_dir, tmp_path / "probed", *args))
    monkeypatch.setattr(es_presets, "probe_pace", lambda *a, **k: PACE)
    es.main(run_args(tiny_model_dir, tmp_path / "not", *args))
    a, b = (load_file(str(tmp_path / name / "final" / "model.safetensors")) for name in ("probed", "not"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_presets_benchmark_puts_the_estimate_beside_the_measured_time(tiny_model_dir, tmp_path):
    """``benchmarks.speed.presets`` on the tiny model: one ES iteration of a toy env's CPU preset, with
    ``--env-args`` passed on to the trainer."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    done = subprocess.run([sys.executable, "-m", "benchmarks.speed.presets", "--envs", "toy_envs:Letter-v0",
                           "--model", str(tiny_model_dir), "--iterations", "1", "--out", str(tmp_path / "p"),
                           "--env-args", '{"train_size": 6}'],
                          capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = json.loads((tmp_path / "p" / "presets.json").read_text())["results"]
    assert result["units"] == 1 and result["seconds_per_unit"] > 0 and result["estimated_per_unit"]
    assert "the CPU preset" in result["estimate"] and "(--preset cpu)" in result["estimate"]
    config = yaml.safe_load((Path(result["run"]) / "config.yaml").read_text())
    assert json.loads(config["env_args"]) == {"train_size": 6} and config["sources"]["env_args"] == "flag"
    row = (tmp_path / "p" / "presets.md").read_text().splitlines()[-1]
    assert row.startswith(f"| es | toy_envs:Letter-v0 | {result['estimated_per_unit']} | ")


def test_a_preset_value_that_clashes_with_a_given_one_is_one_line():
    with pytest.raises(es.ConfigError, match=r"--population: must be even with --mirrored \(the cpu preset sets "
                                             r".*--mirrored True.*give such a value yourself, or --preset paper\)"):
        es_choice(["--env", "Sudoku-v0", "--population", "5"], seconds_per_member_row=10.0)
