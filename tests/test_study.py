"""benchmarks.study: the whole comparison (five methods x grids x seeds at one sample budget) on a
tiny model and a toy env, its outputs, its resume after a kill, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.study import (driver as study, config as study_config, plan as study_plan, record as study_record,
                              rerender as study_rerender, run as study_run)

LETTER = "toy_envs:Letter-v0"  # reward = share of "a" characters in the completion
LABELS = ("ES (full-rank)", "ES (low-rank)", "GRPO", "Dr.GRPO", "PPO")


def tiny_argv(out, model_dir, *extra: str) -> list[str]:
    """Two seeds, 32 responses per run: ES 4 x 2 prompts x 4 iterations, low-rank ES 8 x 2 x 2,
    RL 2 prompts x 4 responses x 4 steps; one ES sigma and two RL settings (beta 0 and > 0)."""
    return ["--env", LETTER, "--seeds", "2", "--max-samples", "32", "--model", str(model_dir), "--out", str(out),
            "--population", "4", "--lowrank-population", "8", "--group-size", "4", "--batch-size", "2",
            "--sigmas", "0.01", "--betas", "0,0.01", "--lrs", "1e-3", "--kl-samples", "2", *extra]


def test_tiny_study_writes_every_output_with_all_five_methods(tmp_path, tiny_model_dir, one_thread, kill_on_call):
    out = tmp_path / "study"
    trained = []
    real_train = study_run.train_run

    def counting(cfg, run, argv):
        if not (run.path / "final").is_dir():
            trained.append((run.method, run.setting, run.seed))
        return real_train(cfg, run, argv)

    study_run.train_run = counting
    try:
        with kill_on_call(study, "finish_run", 6):  # killed after 5 runs: a study stopped halfway
            study.main(tiny_argv(out, tiny_model_dir))
        assert len(trained) == 5
        study.main(tiny_argv(out, tiny_model_dir))  # the same command resumes
    finally:
        study_run.train_run = real_train
    # 2 seeds x (1 + 1 ES settings + 3 RL methods x 2 settings) = 16 runs, each trained once
    assert len(trained) == 16 and len(set(trained)) == 16

    for name in ("table1.md", "table2.md", "runs.md", "seed_variance.md", "curves.png", "results.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert list(out.glob("pareto-*.png"))
    table1 = (out / "table1.md").read_text()
    for label in LABELS + ("Original",):
        assert f"| {label} |" in table1
    table2 = (out / "table2.md").read_text()
    assert all(label in table2 for label in LABELS) and "beta=0 lr=0.001" in table2 and "sigma=0.01" in table2

    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert len(runs) == 16 and {r["method"] for r in runs} == set(study.DEFAULT_METHODS)
    for r in runs:
        assert r["validation"]["samples"] <= 32  # never over the budget
        assert r["greedy"]["split"] == "test" and r["kl"]["samples"] == 2 and r["kl"]["kl_mean"] is not None
        assert r["hacked"] in (True, False)
    # the same sample budget for every method: each run used all 32 responses
    assert {r["validation"]["samples"] for r in runs} == {32}
    # selection on the training prompts (Letter-v0's 4 are too few to carve), never on test
    assert results["selected_on"] == "train"
    assert results["splits"] == {"train": {"examples": 4, "prompts": 4}, "test": {"examples": 4, "prompts": 4}}
    assert all(r["splits"] == results["splits"] for r in runs)
    assert "splits: train 4 examples (4 distinct prompts), test 4 examples (4 distinct prompts)" in table1
    for method, chosen in results["selection"].items():
        assert set(chosen["all"]) == {r["setting"] for r in runs if r["method"] == method}
    assert results["base"]["kl"]["kl_mean"] == 0.0
    assert results["methods"]["grpo"]["seeds"] == 2 and len(results["methods"]["grpo"]["test_pass@1"]) == 2
    # every table reports each method's actual training responses, and how its numbers were computed
    assert all(m["training_responses"] == [32] * m["runs"] for m in results["methods"].values())
    assert "| Training responses |" in table1 and "| ES (low-rank) | sigma=0.01 |" in table1
    assert all(row.split(" | ")[4] == "32" for row in table1.splitlines() if row.startswith("| ES (low-rank)"))
    for name in ("table1.md", "table2.md", "runs.md", "seed_variance.md"):
        text = (out / name).read_text()
        assert "(budget 32): ES (full-rank) 32, ES (low-rank) 32, GRPO 32, Dr.GRPO 32, PPO 32" in text, name
        assert "device and dtype: evaluation cpu float32, training cpu float32; engine: native" in text, name
    assert all(r["runtime"] == ["cpu float32"] and r["greedy"]["device"] == "cpu" for r in runs)
    # the test set's errors over distinct prompts: every measurement's, from the test items' prompt digests
    assert json.loads((out / "evals" / "test_prompts.json").read_text())["prompts"] == 4
    assert all(s.get("reward_se") is not None for s in [*results["base"].values(), *(r[k] for r in runs for k in ("greedy", "kl"))])
    assert "| Test SE (prompts) | From the base |" in table1
    # weights are deleted once measured; logs stay
    assert not list(out.glob("runs/*/*/*/final")) and len(list(out.glob("runs/*/*/*/log.jsonl"))) == 16
    # the runs' evaluation before training: made once per method at most, logged by every run
    shared = [e["record"] for e in json.loads((out / "evals" / study_plan.BASE_EVAL).read_text()).values()]
    firsts = [json.loads(path.read_text().splitlines()[0]) for path in out.glob("runs/*/*/*/log.jsonl")]
    assert all(first["iteration"] == 0 and first in shared for first in firsts) and len(shared) <= 5
    # the report is re-rendered from results.json alone, to the same files
    written = {name: (out / name).read_text() for name in ("table1.md", "table2.md", "runs.md", "seed_variance.md")}
    for path in out.glob("runs/*/*/*/log.jsonl"):
        path.unlink()
    study_rerender.main([str(out)])
    assert written == {name: (out / name).read_text() for name in written}


def as_if_each_iteration_took(run: Path, seconds: float) -> list[int]:
    """Rewrite ``run``'s log as if each logged iteration had taken ``seconds``; the iterations it holds."""
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    (run / "log.jsonl").write_text("".join(json.dumps({**r, "seconds": seconds} if "seconds" in r else r) + "\n"
                                           for r in log))
    return [r["iteration"] for r in log if "seconds" in r]


def test_a_run_killed_while_saving_its_final_model_resumes(tmp_path, tiny_model_dir, one_thread, monkeypatch):
    """Killed half-way through writing a run's final/ (weights written, tokenizer not): the same
    command resumes the study to the end, instead of failing for good on a half-written model."""
    from transformers import PreTrainedTokenizerBase

    out = tmp_path / "study"
    real = PreTrainedTokenizerBase.save_pretrained

    def killed_in_final(self, directory, *args, **kwargs):
        if str(directory).endswith("final.tmp"):
            raise KeyboardInterrupt
        return real(self, directory, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(PreTrainedTokenizerBase, "save_pretrained", killed_in_final)
        with pytest.raises(KeyboardInterrupt):
            study.main(tiny_argv(out, tiny_model_dir, "--seeds", "1", "--methods", "es_full"))
    [run] = list(out.glob("runs/*/*/*"))
    assert not (run / "final").exists()  # its final evaluation is logged, but no half model is left
    # the first invocation's iterations as if each had taken 1000 s: the run's wall time must count them
    trained = len(as_if_each_iteration_took(run, 1000.0))
    study.main(tiny_argv(out, tiny_model_dir, "--seeds", "1", "--methods", "es_full"))
    assert (out / "table1.md").is_file()
    record = json.loads((out / "results.json").read_text())["runs"][0]
    assert record["greedy"]["n"] > 0
    assert trained > 0 and 1000.0 * trained <= record["wall_seconds"] < 1000.0 * trained + 600


def test_a_resumed_runs_wall_time_counts_a_redone_iteration_once(tmp_path, tiny_model_dir, one_thread, kill_on_call):
    """A run killed after logging step 2 but before its checkpoint redoes step 2 on resume: its wall
    time counts the kept step 1 from the first invocation, and step 2 only as redone."""
    from trainers.rl import loop

    out, argv = tmp_path / "study", ["--seeds", "1", "--methods", "grpo", "--betas", "0"]
    with kill_on_call(loop, "save_checkpoint", 2):  # step 1 checkpointed, step 2 logged, then killed
        study.main(tiny_argv(out, tiny_model_dir, *argv))
    [run] = list(out.glob("runs/*/*/*"))
    assert as_if_each_iteration_took(run, 1000.0) == [1, 2]
    study.main(tiny_argv(out, tiny_model_dir, *argv))
    record = json.loads((out / "results.json").read_text())["runs"][0]
    assert 1000.0 <= record["wall_seconds"] < 1600.0  # step 1's 1000 s kept; the lost step 2 not counted


def test_es_grid_over_sigma_and_alpha_and_sampled_members(tmp_path, tiny_model_dir, one_thread):
    """--alpha-ratios with several values makes ES's grid sigma x alpha; es_sampled is low-rank ES
    on sampled members, its budget counting every sample."""
    out = tmp_path / "study"
    study.main(tiny_argv(out, tiny_model_dir, "--seeds", "1", "--methods", "es_lowrank,es_sampled", "--alpha-ratios",
                         "0.5,2", "--es-samples", "2", "--kl-samples", "1", "--engine", "hf"))
    results = json.loads((out / "results.json").read_text())
    settings = {(r["method"], r["setting"]) for r in results["runs"]}
    assert settings == {(m, s) for m in ("es_lowrank", "es_sampled") for s in ("sigma=0.01_alpha=0.005", "sigma=0.01_alpha=0.02")}
    assert {r["validation"]["samples"] for r in results["runs"]} == {32}  # es_sampled: 8 members x 2 prompts x 2 samples
    config = (out / "runs" / "es_sampled" / "sigma=0.01_alpha=0.02" / "seed=0" / "config.yaml").read_text()
    assert "temperature: 1.0" in config and "samples_per_prompt: 2" in config and "alpha: 0.02" in config
    assert "ES (low-rank, sampled)" in (out / "table1.md").read_text()
    assert "; engine: hf" in (out / "table1.md").read_text()
    table2 = (out / "table2.md").read_text()  # two alphas per sigma: two rows, not one merged over both
    for alpha in ("alpha=0.005", "alpha=0.02"):
        assert table2.count(f"sigma=0.01 {alpha}") == 2  # es_lowrank and es_sampled


def test_selection_never_reads_the_test_split():
    cfg = study.StudyConfig(methods="grpo", seeds=2)
    cfg.validate()

    def record(setting, val, test):
        return {"method": "grpo", "setting": setting, "validation": {"eval_pass@1": val, "eval_reward": 0.0},
                "greedy": {"pass@1": test}}

    records = [record("a", 0.9, 0.0), record("a", 0.7, 0.0), record("b", 0.5, 1.0), record("b", 0.5, 1.0)]
    assert study_record.select(cfg, records)["grpo"]["setting"] == "a"  # best on validation, worse on test


def test_selection_refuses_a_missing_validation_number():
    """A run without its final validation number is an error, never a 0.0 that beats negative rewards."""
    cfg = study.StudyConfig(env="Conciseness-v0", methods="grpo", seeds=1)
    cfg.validate()
    records = [{"method": "grpo", "setting": "a", "run": "runs/a", "validation": {"eval_pass@1": 1.0, "eval_reward": -196.0}},
               {"method": "grpo", "setting": "b", "run": "runs/b", "validation": {"eval_pass@1": None, "eval_reward": None}}]
    with pytest.raises(study.ConfigError, match="runs/b: no validation eval_reward"):
        study_record.select(cfg, records)


def test_the_validation_number_is_the_final_models(tmp_path):
    """A log whose last held-out record is the base model's (iteration 0) while training reached
    iteration 2 has no validation number for the run: refused, not read as the base model's."""
    run = study_plan.Run("es_full", "sigma=0.001", {"sigma": 1e-3}, 0, tmp_path)
    records = [{"iteration": 0, "eval_pass@1": 1.0, "eval_reward": -196.5},
               {"iteration": 1, "reward_mean": -199.0, "samples": 16},
               {"iteration": 2, "reward_mean": -198.0, "samples": 32}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(study.ConfigError, match="no held-out evaluation of the final model .iteration 2."):
        study_record.validation_result(run)
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write(json.dumps({"iteration": 2, "eval_pass@1": 0.5, "eval_reward": -90.0}) + "\n")
    result = study_record.validation_result(run)
    assert (result["eval_reward"], result["eval_pass@1"], result["samples"]) == (-90.0, 0.5, 32)
    assert result["cpu_seconds"] is None  # a log from before CPU seconds were recorded: none, not 0


def test_a_runs_cpu_seconds_sum_its_iterations(tmp_path):
    run = study_plan.Run("es_full", "sigma=0.001", {"sigma": 1e-3}, 0, tmp_path)
    records = [{"iteration": 1, "reward_mean": -199.0, "samples": 16, "seconds": 2.0, "cpu_seconds": 3.5},
               {"iteration": 2, "reward_mean": -198.0, "samples": 32, "seconds": 2.0, "cpu_seconds": 4.0},
               {"iteration": 2, "eval_pass@1": 0.5, "eval_reward": -90.0}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = study_record.validation_result(run)
    assert (result["seconds"], result["cpu_seconds"]) == (4.0, 7.5)


@pytest.mark.parametrize("extra, message", [
    (["--methods", "es_full,reinforce"], "--methods: unknown method(s) reinforce"),
    (["--max-samples", "4"], "--max-samples 4 is less than one ES (full-rank) iteration (8 responses"),
    (["--sigmas", "1e-3,x"], "--sigmas: expected comma-separated numbers"),
    (["--betas", "-1"], "--betas: must be >= 0"),
    (["--seeds", "0"], "--seeds: must be >= 1"),
    (["--lowrank-population", "7"], "--lowrank-population: must be even with --mirrored"),
    # 40 distinct training prompts, 10 carved for validation: too few to select on by default
    (["--env-args", '{"train_size": 40}', "--val-size", "10"], "--min-val-prompts 20: the validation split holds 10 "
     "distinct prompts (10 examples)"),
    # ES 6 x 8 and RL 6 x 8 = 48 responses, low-rank ES 1 x 32 = 32: 16 apart, two steps of 8
    (["--max-samples", "48", "--lowrank-population", "16"], "--max-samples 48: the methods' actual budgets differ by "
     "16 responses, more than one step of the smallest (8): ES (full-rank) 48 (6 x 8), ES (low-rank) 32 (1 x 32)"),
])
def test_bad_input_is_one_line(tmp_path, tiny_model_dir, capsys, extra, message):
    out = tmp_path / "study"
    with pytest.raises(SystemExit):
        study.main(tiny_argv(out, tiny_model_dir, *extra))
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_a_validation_split_of_enough_distinct_prompts_is_recorded(tmp_path, tiny_model_dir, kill_on_call):
    """--min-val-prompts accepts what the default refuses above; it is a check, not the study's identity."""
    out = tmp_path / "study"
    with kill_on_call(study, "measure", 1):
        study.main(tiny_argv(out, tiny_model_dir, "--env-args", '{"train_size": 40}', "--val-size", "10",
                             "--min-val-prompts", "10"))
    assert "min_val_prompts" not in json.loads((out / "study.json").read_text())


def test_unequal_budgets_pass_when_accepted(tmp_path, tiny_model_dir, kill_on_call):
    """--unequal-budgets accepts the budgets refused above (the tables then show each method's own);
    it changes no run, so it is not part of the study's identity."""
    out = tmp_path / "study"
    with kill_on_call(study, "measure", 1):
        study.main(tiny_argv(out, tiny_model_dir, "--max-samples", "48", "--lowrank-population", "16",
                             "--unequal-budgets", "true"))
    assert "unequal_budgets" not in json.loads((out / "study.json").read_text())


def test_a_study_resumed_on_another_device_is_refused(tmp_path, tiny_model_dir, kill_on_call, capsys):
    """The default dtype follows the device (fp32 on CPU, bf16 on CUDA): a study whose earlier work
    ran elsewhere must not mix its numbers into one table."""
    out = tmp_path / "study"
    with kill_on_call(study, "measure", 2):  # the base model's greedy evaluation is done
        study.main(tiny_argv(out, tiny_model_dir))
    summary = out / "evals" / "base" / "greedy" / "summary.json"
    assert json.loads(summary.read_text())["device"] == "cpu"
    summary.write_text(json.dumps(dict(json.loads(summary.read_text()), device="cuda", dtype="bfloat16")))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        study.main(tiny_argv(out, tiny_model_dir))
    err = capsys.readouterr().err
    assert "its runs and evaluations so far ran on cuda" in err and "this invocation would run on cpu" in err
    assert "Traceback" not in err


def test_a_study_pinned_to_another_machine_refuses_before_running_anything(tmp_path, tiny_model_dir, kill_on_call,
                                                                           capsys):
    """--machine pins a study to the machine its runs so far trained on: elsewhere it stops with one
    line naming both machines, before its directory exists; here it runs. The pin is where the runs
    happen, not what they are, so a running study may take it up without changing its identity."""
    from benchmarks.study.machines import this_machine

    out = tmp_path / "study"
    with pytest.raises(SystemExit):
        study.main(tiny_argv(out, tiny_model_dir, "--machine", "CPU Elsewhere (bf16 units: none)"))
    err = capsys.readouterr().err
    assert (f"--machine: this study is pinned to CPU Elsewhere (bf16 units: none), and this machine is "
            f"{this_machine('cpu')}: a run here would be judged apart") in err
    assert "Traceback" not in err and not out.exists()
    with kill_on_call(study, "measure", 1):  # past the check: the base model's first measurement
        study.main(tiny_argv(out, tiny_model_dir, "--machine", this_machine("cpu")))
    assert "machine" not in json.loads((out / "study.json").read_text())


def test_a_study_pinned_to_another_cpu_model_refuses_though_the_machine_label_matches(tmp_path, tiny_model_dir,
                                                                                        kill_on_call, capsys):
    """--cpu-model tells apart two CPUs with one machine label (a Zen 4 and a Zen 5 are both 'CPU AMD EPYC
    (bf16 units: avx512_bf16)'): with this machine's label and another CPU's numbers the study refuses
    before its directory exists; with this CPU's numbers it runs, and neither pin enters its identity."""
    from benchmarks.study.machines import this_machine
    from trainers.common.hardware import cpu_model

    out = tmp_path / "study"
    here = ["--machine", this_machine("cpu")]
    with pytest.raises(SystemExit):
        study.main(tiny_argv(out, tiny_model_dir, *here, "--cpu-model", "family 999 model 1"))
    err = capsys.readouterr().err
    assert ("--cpu-model: this study is pinned to a CPU of family 999 model 1, and this one is "
            f"{cpu_model() or 'of no listed family and model'}: a run here could share a machine label") in err
    assert "Traceback" not in err and not out.exists()
    if cpu_model() is None:
        pytest.skip("this CPU lists no family and model")
    with kill_on_call(study, "measure", 1):
        study.main(tiny_argv(out, tiny_model_dir, *here, "--cpu-model", cpu_model()))
    saved = json.loads((out / "study.json").read_text())
    assert "machine" not in saved and "cpu_model" not in saved


def test_the_report_refuses_mixed_numerics():
    from benchmarks.study.report import numerics

    base = {"greedy": {"device": "cpu", "dtype": "float32"}}
    run = {"label": "GRPO", "runtime": ["cpu float32"], "greedy": {"device": "cpu", "dtype": "float32"}}
    assert numerics(base, [run]) == "device and dtype: evaluation cpu float32, training cpu float32"
    resumed_on_gpu = dict(run, runtime=["cpu float32", "cuda float32"])
    with pytest.raises(study.ConfigError, match=r"mixes numerics \(GRPO trained on cpu float32 and cuda float32\)"):
        numerics(base, [run, resumed_on_gpu])
    with pytest.raises(study.ConfigError, match="evaluations on cpu float32 and cuda bfloat16"):
        numerics(base, [dict(run, greedy={"device": "cuda", "dtype": "bfloat16"})])
    assert numerics({"greedy": {}}, [{"label": "GRPO"}]).startswith("device and dtype not recorded")


def test_unknown_env_and_changed_options_are_refused(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        study.main(["--env", "Nope-v0", "--out", str(tmp_path / "x")])
    assert "--env:" in capsys.readouterr().err
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"env": "Other-v0"}))
    with pytest.raises(SystemExit):
        study.main(tiny_argv(out, tiny_model_dir))
    assert "holds a study with other options" in capsys.readouterr().err


def test_shipped_study_configs_parse():
    from pathlib import Path

    from trainers.common.config import load_yaml

    configs = sorted(Path("benchmarks/configs").glob("study_*.yaml"))
    assert len(configs) >= 4
    for path in configs:
        cfg = study.StudyConfig(**load_yaml(path))
        cfg.validate()
        if not all(m.endswith("_lora") for m in cfg.method_list):  # an adapter pilot reads beside a full study
            assert set(study.DEFAULT_METHODS) <= set(cfg.method_list), path
        assert 0.0 in cfg.grid("betas"), f"{path}: the RL grid needs a beta = 0 arm"


def test_grad_accum_reaches_the_rl_trainers_and_does_not_define_the_study(tmp_path):
    """--grad-accum only splits each RL step's memory, so a study may resume with another value
    (the Countdown CPU preset needs 4: PPO's policy and critic on 32 rows ran out of 24 GB)."""
    cfg = study.StudyConfig(env="Conciseness-v0", seeds=1, grad_accum=4)
    cfg.validate()
    runs = study_plan.plan(cfg, tmp_path)
    for run in runs:
        argv = study_plan.trainer_argv(cfg, run, 2, ["--eval-split", "train"])
        assert ("--grad-accum" in argv) == (not run.method.startswith("es_")), run.method
        if "--grad-accum" in argv:
            assert argv[argv.index("--grad-accum") + 1] == "4"
            study_plan.trainer_of(run.method).resolve(argv)  # the trainer takes it
    default = study.StudyConfig(env="Conciseness-v0", seeds=1)
    default.validate()
    assert study_config.identity(cfg) == study_config.identity(default)


def test_an_unfinished_run_resumes_with_the_studys_memory_options(tmp_path):
    """A run killed for memory (started with grad_accum 1) resumes with the invocation's --grad-accum
    and --device, the rest of its saved config unchanged."""
    from trainers.common.config import to_dict
    from trainers.common.run_dir import RunDir

    first = study.StudyConfig(env="Conciseness-v0", seeds=1)
    first.validate()
    again = study.StudyConfig(env="Conciseness-v0", seeds=1, grad_accum=4, device="cpu")
    again.validate()
    for run in study_plan.plan(first, tmp_path):
        trainer = study_plan.trainer_of(run.method)
        saved = trainer.resolve(study_plan.trainer_argv(first, run, 2, ["--eval-split", "train"]))
        RunDir(run.path).write_config(to_dict(saved))
        resumed = trainer.resolve(study_plan.resume_argv(run, study_plan.trainer_argv(again, run, 2, ["--eval-split", "train"])))
        assert resumed.resume == str(run.path) and resumed.device == "cpu", run.method
        if not run.method.startswith("es_"):
            assert (saved.grad_accum, resumed.grad_accum) == (1, 4), run.method
        changed = {k for k, v in vars(resumed).items() if vars(saved)[k] != v and not k.startswith("_")}  # options only
        assert changed <= {"resume", "device", "grad_accum"}, (run.method, changed)


@pytest.mark.parametrize("max_samples, n_train, batch_size, expected", [
    (32, 2, None, 1),      # Conciseness, default populations: low-rank ES (N=32) affords one prompt
    (32, 180, None, 1),    # Countdown: the same
    (256, 2, None, 2),     # the default budget: the whole (small) train split
    (256, 180, None, 8),   # ... at most 8 prompts
    (32, 180, 4, 4),       # --batch-size is kept as given (an impossible one is an error, not shrunk)
    (16, 2, None, 1),      # below one low-rank iteration even with one prompt: left to the budget check
])
def test_default_prompts_per_step_fit_the_budget(max_samples, n_train, batch_size, expected):
    """`--seeds 2 --max-samples 32` with every other option at its default runs (fewer prompts per
    step) instead of failing on the low-rank population."""
    cfg = study.StudyConfig(env="Conciseness-v0", seeds=2, max_samples=max_samples, batch_size=batch_size)
    cfg.validate()
    assert study_plan.prompts_per_step(cfg, n_train) == expected


def test_the_default_tiny_budget_passes_the_studys_checks(tmp_path, tiny_model_dir, kill_on_call):
    """The literal tiny study (`--seeds 2 --max-samples 32`, all other options default) gets past
    every budget and flag check; it is stopped at its first measurement (the base model's)."""
    out = tmp_path / "study"
    with kill_on_call(study, "measure", 1):
        study.main(["--env", "Conciseness-v0", "--seeds", "2", "--max-samples", "32",
                    "--model", str(tiny_model_dir), "--out", str(out)])
    assert (out / "study.json").is_file()


def test_commit_adds_exactly_the_result_files(tmp_path, monkeypatch):
    """--commit: each finished run's record is committed alone; whatever else is staged stays staged."""
    import subprocess

    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, capture_output=True, text=True, check=True).stdout  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "other.txt").write_text("staged, not the study's")
    git("add", "other.txt")
    record = tmp_path / "runs" / "grpo" / "s" / "seed=0" / "study_record.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    monkeypatch.chdir(tmp_path)
    study_record.commit([record, tmp_path / "missing.json"], "study x: GRPO s seed=0 done")
    assert git("log", "--format=%s") == "study x: GRPO s seed=0 done\n"
    assert git("show", "--name-only", "--format=").split() == ["runs/grpo/s/seed=0/study_record.json"]
    assert git("diff", "--cached", "--name-only").split() == ["other.txt"]
    study_record.commit([record], "again")  # nothing changed: no commit, no error
    assert len(git("log", "--format=%s").splitlines()) == 1


def test_the_study_settles_its_dtype_and_refuses_another(tmp_path, tiny_model_dir, kill_on_call, capsys):
    """--dtype auto becomes the machine's default (fp32 here: the tests simulate a CPU without bf16
    units), is passed to every run, and a resumed study may not change it."""
    out = tmp_path / "study"
    with kill_on_call(study, "measure", 1):
        study.main(tiny_argv(out, tiny_model_dir))
    assert json.loads((out / "study.json").read_text())["dtype"] == "fp32"
    cfg = study.StudyConfig(env="Conciseness-v0", seeds=1, dtype="fp32")
    cfg.validate()
    for run in study_plan.plan(cfg, tmp_path):
        argv = study_plan.trainer_argv(cfg, run, 2, ["--eval-split", "train"])
        assert argv[argv.index("--dtype") + 1] == "fp32", run.method
    capsys.readouterr()
    with pytest.raises(SystemExit):
        study.main([*tiny_argv(out, tiny_model_dir), "--dtype", "bf16"])
    assert f"--dtype bf16: {out} computes in fp32" in capsys.readouterr().err  # both dtypes named


@pytest.mark.parametrize("name", ["study_conciseness_round2_cpu.yaml", "study_rg_arithmetic_round2_cpu.yaml"])
def test_round_two_presets_give_grids_the_verdict_rules_compare(name, tmp_path):
    """Claim 3 needs every method's step size alone varied over the same factor with as many settings;
    full-rank ES's sigma keeps each member's perturbation in bf16 (correlation 0.93 at 1e-3, docs/es.md)."""
    from pathlib import Path

    from benchmarks.study.verdicts import Study, step_grid
    from trainers.common.config import load_yaml

    cfg = study.StudyConfig(**load_yaml(Path("benchmarks/configs") / name))
    cfg.validate()
    runs = [{"method": r.method, "setting": r.setting, "hparams": r.hparams, "seed": r.seed}
            for r in study_plan.plan(cfg, tmp_path)]
    grids = Study(tmp_path, {"runs": runs, "methods": {}})
    for method in cfg.method_list:
        assert step_grid(grids, method) == (2, pytest.approx(6.0), True), method
    assert min(cfg.grid("sigmas")) >= 1e-3 and cfg.seeds == 4 and set(cfg.method_list) == set(study.DEFAULT_METHODS)


@pytest.mark.parametrize("name", ["study-countdown", "study-conciseness"])
def test_an_older_study_re_renders_to_its_committed_files(name, tmp_path):
    """docs/study-countdown and docs/study-conciseness predate the alpha grid (``alpha_ratio``, one
    value): they re-render from their results.json to the same tables and the same config record."""
    import shutil

    committed = Path(__file__).resolve().parents[1] / "docs" / name
    out = tmp_path / name
    shutil.copytree(committed, out)
    study_rerender.main([str(out)])
    for table in ("table1.md", "table2.md", "runs.md", "seed_variance.md"):
        assert (out / table).read_text() == (committed / table).read_text(), table
    before, after = (json.loads((d / "results.json").read_text()) for d in (committed, out))
    assert after["config"] == before["config"] and "alpha_ratio" in after["config"]


def test_a_grid_whose_selection_sits_at_an_edge_is_extended_beyond_it(tmp_path, tiny_model_dir, one_thread):
    """--extend-grids 1 with two step sizes: the selected one is at an edge either way, so one more step
    beyond it (the grid's own factor) runs on every seed, and the setting is selected again."""
    out = tmp_path / "study"
    study.main(tiny_argv(out, tiny_model_dir, "--seeds", "1", "--methods", "grpo", "--betas", "0",
                         "--lrs", "1e-3,1e-4", "--extend-grids", "1"))
    results = json.loads((out / "results.json").read_text())
    lrs = sorted(r["hparams"]["lr"] for r in results["runs"])
    assert len(lrs) == 3 and (lrs[0] == pytest.approx(1e-5) or lrs[-1] == pytest.approx(1e-2))
    [added] = [r for r in results["runs"] if r.get("extension")]
    assert added["extension"]["round"] == 1 and added["extension"]["selected"] in ("beta=0_lr=0.001", "beta=0_lr=0.0001")
    assert "Grid extended, GRPO: " in (out / "table1.md").read_text() and results["extensions"]
    assert json.loads((out / "study.json").read_text())["extend_grids"] == 1


def test_the_extension_is_one_step_beyond_the_edge_by_the_edges_factor(tmp_path):
    cfg = study.StudyConfig(env="Conciseness-v0", methods="grpo,es_full", seeds=2, betas="0", lrs="4e-6,1.2e-5",
                            sigmas="1e-3", alpha_ratios="0.5,1.5", extend_grids=1)
    cfg.validate()
    records = [{"method": r.method, "setting": r.setting, "hparams": r.hparams, "seed": r.seed}
               for r in study_plan.plan(cfg, tmp_path)]
    top = study_plan.extension(cfg, tmp_path, "grpo", records, "beta=0_lr=1.2e-05")
    assert [(r.setting, r.seed) for r in top] == [("beta=0_lr=3.6e-05", 0), ("beta=0_lr=3.6e-05", 1)]
    assert top[0].hparams["lr"] == pytest.approx(3.6e-5) and top[0].extension == {
        "round": 1, "edge": "top", "selected": "beta=0_lr=1.2e-05"}
    bottom = study_plan.extension(cfg, tmp_path, "es_full", records, "sigma=0.001_alpha=0.0005")
    assert bottom[0].setting == "sigma=0.001_alpha=0.000166667" and bottom[0].extension["edge"] == "bottom"
    added = [{"method": r.method, "setting": r.setting, "hparams": r.hparams, "seed": r.seed,
              "extension": r.extension} for r in top]
    assert study_plan.extension(cfg, tmp_path, "grpo", records + added, "beta=0_lr=3.6e-05") == []  # rounds used up
    cfg.extend_grids = 2
    assert study_plan.extension(cfg, tmp_path, "grpo", records + added, "beta=0_lr=3.6e-05")[0].setting == \
        "beta=0_lr=0.000108"
    assert study_plan.extension(cfg, tmp_path, "grpo", records + added, "beta=0_lr=1.2e-05") == []  # inside


def test_a_grid_tied_at_its_edge_is_extended_once_at_most(tmp_path):
    """Where every setting ties on validation (a method that learned nothing), the selection keeps the
    grid's first setting (its bottom edge): one round runs below it, and the tie then leaves that
    setting inside the grid, so no further round runs whatever --extend-grids allows."""
    from benchmarks.study.record import select

    cfg = study.StudyConfig(env="Conciseness-v0", methods="grpo", seeds=2, betas="0", lrs="4e-6,1.2e-5,3.6e-5",
                            extend_grids=3, metric="eval_pass@1")
    cfg.validate()

    def records(runs):
        return [{"method": r.method, "setting": r.setting, "hparams": r.hparams, "seed": r.seed,
                 **({"extension": r.extension} if r.extension else {}),
                 "validation": {"eval_pass@1": 0.0, "eval_reward": 0.0}} for r in runs]
    grid = records(study_plan.plan(cfg, tmp_path))
    selected = select(cfg, grid)["grpo"]["setting"]
    assert selected == "beta=0_lr=4e-06"
    below = study_plan.extension(cfg, tmp_path, "grpo", grid, selected)
    assert {r.setting for r in below} == {"beta=0_lr=1.33333e-06"} and below[0].extension["edge"] == "bottom"
    both = grid + records(below)
    assert select(cfg, both)["grpo"]["setting"] == "beta=0_lr=4e-06"
    assert study_plan.extension(cfg, tmp_path, "grpo", both, "beta=0_lr=4e-06") == []


def test_an_rl_runs_last_step_is_checkpointed():
    """A learning curve continues a grid run from its last checkpoint: the interval divides the steps."""
    assert [study_plan.quarter(s) for s in (8, 9, 10, 3, 1)] == [2, 1, 2, 1, 1]


def test_options_added_after_a_study_started_do_not_stop_its_resume():
    saved = {"env": "Conciseness-v0", "seeds": 4}
    assert study_config.changed_options(saved, {**saved, "extend_grids": 0, "rule_commit": None}) == []
    assert study_config.changed_options(saved, {**saved, "rule_commit": "ce3ba26"}) == ["rule_commit"]
    assert study_config.changed_options(saved, {**saved, "seeds": 2}) == ["seeds"]


def test_a_resumed_study_may_raise_its_grid_extensions_until_its_curves_start():
    saved = {"env": "Conciseness-v0", "seeds": 4, "extend_grids": 1}
    assert study_config.changed_options(saved, {**saved, "extend_grids": 2}) == []
    assert study_config.changed_options(saved, {**saved, "extend_grids": 0}) == ["extend_grids"]
    assert study_config.changed_options(saved, {**saved, "extend_grids": 2}, curves_started=True) == ["extend_grids"]


def git_repo(path: Path) -> callable:
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    return git


def test_the_rule_commit_is_checked_and_recorded(tmp_path, tiny_model_dir, one_thread, monkeypatch, capsys):
    """--rule-commit: the commit that holds the pre-registered rule, in the checkout's history, recorded
    (its full id) in study.json and every run's record; a study resumed with another is refused."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "study").mkdir(parents=True)
    git = git_repo(repo)
    (repo / "README.md").write_text("no rule yet")
    git("add", "README.md")
    git("commit", "-q", "-m", "before the rule")
    before = git("rev-parse", "HEAD")
    (repo / "benchmarks" / "study" / "verdicts.py").write_text("def claim_near_zero(study): ...\n")
    git("add", ".")
    git("commit", "-q", "-m", "the rule")
    rule = git("rev-parse", "HEAD")
    git("checkout", "-q", "-b", "elsewhere", before)
    (repo / "other.txt").write_text("x")
    git("add", "other.txt")
    git("commit", "-q", "-m", "another line of history")
    elsewhere = git("rev-parse", "HEAD")
    git("checkout", "-q", "-")
    monkeypatch.chdir(repo)
    with pytest.raises(study.ConfigError, match="no such commit"):
        study_record.pinned_rule("0123456")
    with pytest.raises(study.ConfigError, match="holds no benchmarks/study/verdicts.py"):
        study_record.pinned_rule(before)
    with pytest.raises(study.ConfigError, match="not in this checkout's history"):
        study_record.pinned_rule(elsewhere)
    assert study_record.pinned_rule(rule[:8]) == rule

    out = tmp_path / "study"
    argv = tiny_argv(out, tiny_model_dir, "--seeds", "1", "--methods", "grpo", "--betas", "0")
    study.main([*argv, "--rule-commit", rule[:8]])
    assert json.loads((out / "study.json").read_text())["rule_commit"] == rule
    assert json.loads((out / "results.json").read_text())["runs"][0]["rule_commit"] == rule
    capsys.readouterr()
    with pytest.raises(SystemExit):
        study.main([*argv, "--rule-commit", before])
    assert "holds no benchmarks/study/verdicts.py" in capsys.readouterr().err
    (repo / "benchmarks" / "study" / "verdicts.py").write_text("def claim_near_zero(study): return 'changed'\n")
    git("commit", "-q", "-am", "the rule changed after the study started")
    with pytest.raises(SystemExit):
        study.main([*argv, "--rule-commit", git("rev-parse", "HEAD")])
    assert "holds a study with other options (rule_commit)" in capsys.readouterr().err


def test_the_round_three_preset_has_round_twos_budget_and_grids_claim_3_compares(tmp_path):
    """study_rg_nearzero_r3_cpu.yaml: round two's budget (512 responses, 4 seeds, the five methods and ES
    and GRPO on adapters, curves to 4x) and step-size grids of 3 points one common factor apart, each
    method's middle one inside."""
    from benchmarks.study.curves import budgets
    from benchmarks.study.verdicts import Study, grids_differ, step_sizes
    from trainers.common.config import load_yaml

    cfg = study.StudyConfig(**load_yaml(Path("benchmarks/configs/study_rg_nearzero_r3_cpu.yaml")))
    cfg.validate()
    assert (cfg.seeds, cfg.max_samples, budgets(cfg)) == (4, 512, [512, 1024, 2048]) and cfg.extend_grids >= 1
    assert set(cfg.method_list) == set(study.DEFAULT_METHODS) | {"es_lora", "grpo_lora"}
    runs = [{"method": r.method, "setting": r.setting, "hparams": r.hparams, "seed": r.seed}
            for r in study_plan.plan(cfg, tmp_path)]
    grids = Study(tmp_path, {"runs": runs, "methods": {}})
    middle = {m: step_sizes(grids, m)[1][step_sizes(grids, m)[0][1]] for m in cfg.method_list}
    grids.results["methods"] = {m: {"label": m, "setting": s} for m, s in middle.items()}
    assert all(len(step_sizes(grids, m)[0]) == 3 for m in cfg.method_list)
    assert grids_differ(grids) is None


@pytest.mark.parametrize("machine", ["zen5", "xeon", "xeonamx", "zen4", "zen1"])
def test_each_round_three_replicate_is_the_original_study_on_another_machine(machine):
    """A replicate's config defines the same runs as round three's (the identity its study.json holds),
    differing only in what the command adds (the rule commit) and the driver resolves (the metric); a
    started replicate's study.json is the original's, option for option."""
    from trainers.common.config import load_yaml

    original = json.loads(Path("docs/study-rg-nearzero-r3/study.json").read_text())
    cfg = study.StudyConfig(**load_yaml(Path(f"benchmarks/configs/study_rg_nearzero_r3_{machine}_cpu.yaml")))
    cfg.validate()
    own = study_config.identity(cfg)
    assert set(study_config.changed_options(original, own, curves_started=True)) <= {"metric", "rule_commit"}
    assert cfg.machine and cfg.machine.startswith("CPU ") and cfg.cpu_model.startswith("family ")
    saved = Path(f"docs/study-rg-nearzero-r3-{machine}/study.json")
    if saved.exists():
        assert json.loads(saved.read_text()) == original
