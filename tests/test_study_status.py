"""``python -m benchmarks.study.status``: the runs and curve points of a study done and left, and the
time left estimated from each method's finished runs, on a study directory written by hand."""

import json

import pytest

from benchmarks.study import status as study_status
from benchmarks.study.config import StudyConfig
from benchmarks.study.plan import extension, plan


def write_record(run, train_s: float, wall_s: float, val: float = 0.5, test: float = 0.5) -> None:
    run.path.mkdir(parents=True)
    record = {"method": run.method, "setting": run.setting, "seed": run.seed, "hparams": run.hparams,
              **({"extension": run.extension} if run.extension else {}),
              "validation": {"seconds": train_s, "eval_pass@1": val, "eval_reward": val}, "wall_seconds": wall_s,
              "greedy": {"pass@1": test, "reward_mean": test + 0.01}}
    (run.path / "study_record.json").write_text(json.dumps(record))


@pytest.fixture
def cfg():
    # GRPO and PPO, one lr each, 3 seeds: 6 runs; curves to 512 (the grid's budget), 1024, 2048
    return StudyConfig(env="Conciseness-v0", methods="grpo,ppo", lrs="1e-5", betas="0", seeds=3, max_samples=512,
                       curve_budgets="1024,2048")


def test_counts_and_time_left_come_from_the_finished_runs(cfg, tmp_path):
    (tmp_path / "study.json").write_text("{}")
    runs = plan(cfg, tmp_path)
    grpo = [r for r in runs if r.method == "grpo"]
    # GRPO's medians: 60 s training, 30 s the rest (the paused 600 s run does not move a median of 3)
    for run, (train, wall) in zip(grpo, [(60, 90), (600, 700), (50, 80)]):
        write_record(run, train, wall)
    # one curve point already measured: GRPO seed 0 at 512
    curve = tmp_path / "curves" / "grpo" / grpo[0].setting / "seed=0"
    curve.mkdir(parents=True)
    (curve / "curve_record.json").write_text(json.dumps([{"budget": 512}]))

    text = study_status.status(cfg, tmp_path)
    assert text.splitlines()[0] == (f"study {tmp_path}: grid 3 of 6 runs done; learning curves 1 of 18 points "
                                    "(budgets 512, 1024, 2048), after the grid")
    assert "next or running: PPO beta=0_lr=1e-05 seed=0\n" in text  # not started: no progress
    # grid: PPO has no finished run, so nothing of it is counted; curves: GRPO's 8 points left, each
    # 30 s of measuring plus 60 s of training per 512 responses (512 -> 1024: x1, 1024 -> 2048: x2);
    # a point at 512 is the grid run itself: nothing to do
    curve_s = 3 * (60 + 30) + 3 * (120 + 30)
    assert f"grid 0 min, curves {curve_s / 60:.0f} min" in text
    assert "without PPO (no finished run to estimate from)" in text
    assert "GRPO: runs done 3, per run (median) 1.0 min training + 0.5 min start-up and measuring" in text


def test_a_paused_iteration_does_not_decide_a_runs_training_time(cfg, tmp_path):
    """With the run's log on this machine, its training time is its iterations times their median:
    an iteration paused for 30 min (its record's sum: 1860 s) counts as the others' 20 s."""
    (tmp_path / "study.json").write_text("{}")
    run = plan(cfg, tmp_path)[0]
    write_record(run, 1860, 1890)
    log = [{"iteration": 0, "eval_pass@1": 0.5}, *({"iteration": i, "reward_mean": 0.5, "seconds": s}
                                                    for i, s in enumerate([20, 1800, 20, 20], 1))]
    (run.path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    # the next run started: how far its log goes
    nxt = plan(cfg, tmp_path)[1]
    nxt.path.mkdir(parents=True)
    (nxt.path / "config.yaml").write_text("steps: 8\nmax_samples: 512\n")
    (nxt.path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log[:3]))
    assert f"next or running: {nxt.label} {nxt.setting} seed={nxt.seed} (2 of 8 steps logged)" in study_status.status(cfg, tmp_path)
    assert study_status.training_seconds(json.loads((run.path / "study_record.json").read_text()), run.path) == 80
    assert "GRPO: runs done 1, per run (median) 1.3 min training + 0.5 min start-up" in study_status.status(cfg, tmp_path)


def test_a_finished_grid_names_the_next_curve_point_and_a_finished_study_nothing(cfg, tmp_path):
    (tmp_path / "study.json").write_text("{}")
    for run in plan(cfg, tmp_path):
        write_record(run, 60, 90)
        curve = tmp_path / "curves" / run.method / run.setting / f"seed={run.seed}"
        curve.mkdir(parents=True)
        (curve / "curve_record.json").write_text(json.dumps([{"budget": b} for b in (512, 1024, 2048)]))
    (curve / "curve_record.json").write_text(json.dumps([{"budget": 512}]))  # PPO seed 2: at 512 only
    assert "next or running: the curve of PPO seed=2 to 1024 responses" in study_status.status(cfg, tmp_path)
    (curve / "curve_record.json").write_text(json.dumps([{"budget": b} for b in (512, 1024, 2048)]))
    text = study_status.status(cfg, tmp_path)
    assert "grid 6 of 6 runs done; learning curves 18 of 18 points" in text
    assert "nothing left" in text and "next or running" not in text


def test_no_study_and_no_out_are_one_line(tmp_path, capsys):
    assert "no study there yet" in study_status.status(StudyConfig(env="Conciseness-v0"), tmp_path)
    with pytest.raises(SystemExit):
        study_status.main(["--env", "Conciseness-v0"])
    assert "error: --out: the study's directory" in capsys.readouterr().err


def test_the_finished_settings_numbers_so_far_while_the_grid_runs(tmp_path):
    """Each setting with a finished run: its seeds and their means, in the study's method order;
    once the grid is done the study's own tables take over, and the block goes."""
    cfg = StudyConfig(env="Conciseness-v0", methods="ppo,grpo", lrs="1e-5,1e-6", betas="0", seeds=2, max_samples=512)
    (tmp_path / "study.json").write_text("{}")
    runs = {(r.method, r.setting, r.seed): r for r in plan(cfg, tmp_path)}
    write_record(runs["grpo", "beta=0_lr=1e-05", 0], 60, 90, val=0.6, test=0.5)
    write_record(runs["grpo", "beta=0_lr=1e-05", 1], 60, 90, val=0.8, test=0.7)
    write_record(runs["ppo", "beta=0_lr=1e-06", 1], 60, 90, val=0.4, test=0.3)
    write_record(runs["ppo", "beta=0_lr=1e-05", 0], 60, 90, val=0.2, test=0.1)
    lines = study_status.status(cfg, tmp_path).splitlines()
    start = lines.index("finished settings so far (means over the seeds done; the study selects on validation "
                        "once the grid is done):")
    assert lines[start + 1:] == [  # the grid's order of lr (1e-5, then 1e-6), not the text's
        "  PPO beta=0_lr=1e-05, seeds 0: validation pass@1 0.200; test pass@1 0.100, reward 0.110 "
        "(each seed's test / validation pass@1: 0.10 / 0.20)",
        "  PPO beta=0_lr=1e-06, seeds 1: validation pass@1 0.400; test pass@1 0.300, reward 0.310 "
        "(each seed's test / validation pass@1: 0.30 / 0.40)",
        "  GRPO beta=0_lr=1e-05, seeds 0, 1: validation pass@1 0.700; test pass@1 0.600, reward 0.610 "
        "(each seed's test / validation pass@1: 0.50 / 0.60, 0.70 / 0.80)"]
    for run in runs.values():
        if not (run.path / "study_record.json").is_file():
            write_record(run, 60, 90)
    assert "finished settings so far" not in study_status.status(cfg, tmp_path)


def test_a_grid_done_with_its_selection_at_an_edge_names_the_runs_beyond_it_next(tmp_path):
    """As the driver does, a method whose grid is done and whose selection sits at the grid's edge
    runs one step beyond it (``--extend-grids``) before the next method: those runs are next, and
    their time is in the estimate."""
    cfg = StudyConfig(env="Conciseness-v0", methods="grpo,ppo", lrs="1e-6,1e-5", betas="0", seeds=2, max_samples=512,
                      extend_grids=1, metric="eval_pass@1")
    (tmp_path / "study.json").write_text("{}")
    for run in plan(cfg, tmp_path):
        if run.method == "grpo":  # the larger lr is better on validation: the top edge
            write_record(run, 60, 90, val=0.8 if run.hparams["lr"] == 1e-5 else 0.2)
    text = study_status.status(cfg, tmp_path)
    assert "next or running: GRPO beta=0_lr=0.0001 seed=0\n" in text  # 1e-5 x (1e-5 / 1e-6)
    assert "grid 3 min" in text  # its two seeds, 1.5 min each; PPO has no finished run to count
    [first, second] = extension(cfg, tmp_path, "grpo", [json.loads(p.read_text()) for p in
                                                        tmp_path.glob("runs/grpo/*/*/study_record.json")],
                                "beta=0_lr=1e-05")
    # its first seed done, and worse than the edge: the round still runs its other seed
    write_record(first, 60, 90, val=0.1)
    assert "next or running: GRPO beta=0_lr=0.0001 seed=1\n" in study_status.status(cfg, tmp_path)
    write_record(second, 60, 90, val=0.1)
    write_record(plan(cfg, tmp_path)[4], 60, 90)  # PPO's first run
    text = study_status.status(cfg, tmp_path)
    assert "(and 2 beyond the grids' edges)" in text
    assert "next or running: PPO beta=0_lr=1e-06 seed=1\n" in text  # one round only: PPO's grid comes next
    # the numbers so far: the setting beyond GRPO's edge after its grid's, before PPO's
    assert [line.split(",")[0] for line in text.splitlines()[-4:]] == [
        "  GRPO beta=0_lr=1e-06", "  GRPO beta=0_lr=1e-05", "  GRPO beta=0_lr=0.0001", "  PPO beta=0_lr=1e-06"]


def test_a_method_with_only_a_started_run_is_estimated_provisionally(cfg, tmp_path):
    """PPO has no finished run but one started, with 3 iterations logged: its runs are estimated
    from their median (one paused iteration does not decide it) times the run's 8 steps, plus the
    other methods' median start-up and measuring; the output says the figure is provisional."""
    (tmp_path / "study.json").write_text("{}")
    runs = plan(cfg, tmp_path)
    for run in runs[:3]:  # GRPO: 60 s training, 30 s the rest
        write_record(run, 60, 90)
    started = runs[3]
    started.path.mkdir(parents=True)
    (started.path / "config.yaml").write_text("steps: 8\nmax_samples: 512\n")
    log = [{"iteration": 0, "eval_pass@1": 0.0},
           *({"iteration": i, "reward_mean": 0.0, "seconds": s} for i, s in enumerate([45, 900, 45], 1))]
    (started.path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    text = study_status.status(cfg, tmp_path)
    assert "estimated from the finished runs (PPO provisionally, from a started run): grid " \
           f"{study_status.hours(3 * (8 * 45 + 30))}," in text
    assert "PPO: runs done 0, per run (provisional, from 3 logged iterations of a started run) 6.0 min training + " \
           "0.5 min start-up and measuring (the other methods' median)" in text
    assert "no finished run to estimate from" not in text
    # a started run with no iteration logged yet gives nothing to estimate from
    (started.path / "log.jsonl").write_text(json.dumps(log[0]) + "\n")
    assert "without PPO (no finished run to estimate from)" in study_status.status(cfg, tmp_path)


def test_a_study_with_nothing_to_estimate_from_says_so_instead_of_0_min(cfg, tmp_path):
    """A new study (no run finished, none with an iteration logged) has no estimate: not "0 min"."""
    (tmp_path / "study.json").write_text("{}")
    text = study_status.status(cfg, tmp_path)
    assert "time left on this machine: not estimated until a run of some method has finished or logged an " \
           "iteration" in text
    assert " 0 min" not in text
    write_record(plan(cfg, tmp_path)[0], 60, 90)
    assert "time left on this machine, estimated from the finished runs: grid " in study_status.status(cfg, tmp_path)


def test_a_pinned_study_says_whether_this_machine_may_resume_it(cfg, tmp_path):
    from benchmarks.study.machines import this_machine

    (tmp_path / "study.json").write_text("{}")
    assert "(--machine)" not in study_status.status(cfg, tmp_path)
    here = this_machine("cpu")
    cfg.device = "cpu"
    cfg.machine = here
    assert f"pinned to {here} (--machine): this machine, so the study's command resumes it here" in \
        study_status.status(cfg, tmp_path)
    cfg.machine = "CPU Elsewhere (bf16 units: none)"
    assert (f"pinned to CPU Elsewhere (bf16 units: none) (--machine): this machine is {here}, so the study's "
            "command refuses to run here") in study_status.status(cfg, tmp_path)
    from trainers.common.hardware import cpu_model

    cfg.machine = here
    assert f"this CPU is {cpu_model() or 'of no listed family and model'} (--cpu-model pins" in \
        study_status.status(cfg, tmp_path)
    cfg.cpu_model = "family 999 model 1"
    assert (f"pinned to a CPU of family 999 model 1 (--cpu-model): this one is "
            f"{cpu_model() or 'of no listed family and model'}, so the study's command refuses to run here") in \
        study_status.status(cfg, tmp_path)
    # the label matches and the CPU does not (a Zen 1 and a Zen 3 share one): the study refuses, and says so
    assert (f"pinned to {here} (--machine): this machine, but --cpu-model is not, so the study's command refuses "
            "to run here") in study_status.status(cfg, tmp_path)
    cfg.cpu_model = cpu_model()
    if cfg.cpu_model:
        assert (f"pinned to a CPU of {cfg.cpu_model} (--cpu-model): this machine, so the study's command resumes "
                "it here") in study_status.status(cfg, tmp_path)
