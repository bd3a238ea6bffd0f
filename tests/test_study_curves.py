"""benchmarks.study --curve-budgets: each method's selected setting continued, on every seed, to
larger budgets, with validation and test measured at each; resumable; its first point repeats the
grid's run."""

from __future__ import annotations

import json

import pytest

from benchmarks.study import driver as study, curves as study_curves, rerender as study_rerender


def curve_argv(out, model_dir, *extra: str) -> list[str]:
    return ["--env", "toy_envs:Letter-v0", "--seeds", "1", "--max-samples", "16", "--model", str(model_dir),
            "--out", str(out), "--methods", "es_full,grpo", "--population", "4", "--group-size", "4",
            "--batch-size", "2", "--sigmas", "0.01", "--betas", "0", "--lrs", "1e-3", "--kl-samples", "2", *extra]


def grid_and_curve_logs(out, method: str, setting: str) -> tuple[list[str], list[str]]:
    """The training log lines of seed 0's grid run and of its curve, to check one continues the other."""
    return tuple((out / where / method / setting / "seed=0" / "log.jsonl").read_text().splitlines()
                 for where in ("runs", "curves"))


def test_curves_continue_the_grid_runs_and_resume(tmp_path, tiny_model_dir, one_thread, kill_on_call):
    """With --curve-budgets from the start, each grid run keeps what continuing it needs (ES its update
    log, RL its newest checkpoint; an unselected setting's is released), and its curve continues it:
    the first point is the grid run's record, the later ones its continuation."""
    out = tmp_path / "study"
    argv = curve_argv(out, tiny_model_dir, "--curve-budgets", "32,48", "--lrs", "1e-3,1e-4")
    with kill_on_call(study_curves, "continue_to", 2):  # killed on its way to the second budget of a run
        study.main(argv)
    study.main(argv)  # resumes at the next budget

    curves = json.loads((out / "curves.json").read_text())
    assert curves["budgets"] == [16, 32, 48]
    points = curves["points"]
    assert sorted((p["method"], p["budget"]) for p in points) == [(m, b) for m in ("es_full", "grpo")
                                                                   for b in (16, 32, 48)]
    grid = {r["method"]: r for r in json.loads((out / "results.json").read_text())["runs"]
            if r["setting"] == json.loads((out / "results.json").read_text())["selection"][r["method"]]["setting"]}
    for p in points:
        assert p["validation"]["samples"] == p["budget"] and p["greedy"]["split"] == "test" and "kl" in p
        assert p["validation"]["cpu_seconds"] > 0 and p["measure_cpu_seconds"] > 0  # what each point cost
        assert p["machines"] and p["machines"][0]["cpu"]  # and where, since seconds compare within one machine
        curve = out / "curves" / p["method"] / p["setting"] / "seed=0"
        if p["budget"] == 16:  # the grid run itself: its record, never trained or measured again
            assert p["grid_run"] and p["greedy"] == grid[p["method"]]["greedy"]
            assert p["validation"] == grid[p["method"]]["validation"] and not (curve / "eval" / "b16").exists()
        else:
            assert (curve / f"completions-{p['budget']}.jsonl.gz").is_file()
    for method in ("es_full", "grpo"):  # the curve's log goes on from the grid run's: a continuation
        run_log, curve_log = grid_and_curve_logs(out, method, grid[method]["setting"])
        assert curve_log[:len(run_log)] == run_log and len(curve_log) > len(run_log)
    # RL's checkpoint was handed to the curve, the unselected setting's released; nothing of weights stays
    assert not list(out.glob("runs/*/*/*/checkpoints")) and not list(out.glob("runs/*/*/*/final"))
    assert not list(out.glob("curves/*/*/*/final")) and not list(out.glob("curves/*/*/*/checkpoints"))
    text = (out / "learning_curve.md").read_text()
    assert "At 16 responses 2 of 2 curves continue their grid run." in text
    assert "Machines that trained the points: CPU " in text and ": 6 points." in text
    assert text.count("| ES (full-rank) |") == 3 + 3 and "Claim 1 at 48 responses:" in text  # scores, costs
    assert "Does ES catch up with 3x the budget? ES (full-rank) at 48 responses" in text
    assert curves["catch_up"] in text and curves["repeats_grid"] in text
    cost_rows = [line.split("|")[1:-1] for line in text.split("What each run cost")[1].splitlines()
                 if line.startswith("| ES (full-rank) |")]
    assert all(float(cell.split(" (")[0]) >= 0 and cell.strip().endswith("(1)") for row in cost_rows for cell in row[2:])
    assert (out / "learning_curve.png").stat().st_size > 0
    assert "curve_budgets" not in json.loads((out / "study.json").read_text())  # an extension, not the grid
    # the curve's completions are evidence too (the first point's are its grid run's): counted, and
    # rescored to the same table
    from benchmarks.study import evidence

    # 2 methods x the 2 continued budgets x (greedy, kl); the first budget's are counted as the grid runs'
    assert evidence.main([str(out)]).count("(curve)") == 2 * 2 * 2
    evidence.main([str(out), "--rescore", str(tmp_path / "rescored")])
    assert (tmp_path / "rescored" / "learning_curve.md").read_text() == text
    # and re-rendered in place from curves.json, as the study wrote them
    before = (out / "curves.json").read_text()
    (out / "learning_curve.md").write_text("stale")
    study_rerender.main([str(out)])
    assert (out / "learning_curve.md").read_text() == text and (out / "curves.json").read_text() == before


def test_a_curve_whose_grid_run_kept_nothing_retrains_it_and_says_so(tmp_path, tiny_model_dir, one_thread):
    """The grid run first, without curves (RL's checkpoint is deleted once measured, ES's update log is
    a log and stays), then the curves: ES continues its grid run, GRPO retrains its own."""
    out = tmp_path / "study"
    study.main(curve_argv(out, tiny_model_dir))
    assert not (out / "curves").exists()
    study.main(curve_argv(out, tiny_model_dir, "--curve-budgets", "32"))
    points = {(p["method"], p["budget"]): p for p in json.loads((out / "curves.json").read_text())["points"]}
    assert points["es_full", 16].get("grid_run") and points["grpo", 16].get("retrained")
    text = (out / "learning_curve.md").read_text()
    assert "At 16 responses 1 of 2 curves continue their grid run; 1 retrained it (its state was gone)" in text
    assert "The verdicts read the grid's runs at this budget." in text


def test_a_curve_continues_a_selected_setting_beyond_the_grids_edge(tmp_path, tiny_model_dir, one_thread,
                                                                     monkeypatch):
    """A grid extended beyond its edge (--extend-grids) whose extension wins the selection: the
    extension's RL checkpoint is kept through the release after each batch (the grid's are dropped),
    and the curve continues that run. The selection is forced to the extension, as a tiny model's
    validation scores cannot be steered."""
    from benchmarks.study import record as study_record

    def prefer_extension(cfg, records, methods=None):
        chosen = study_record.select(cfg, records, methods)
        for method in chosen:
            beyond = [r["setting"] for r in records if r["method"] == method and r.get("extension")]
            if beyond:
                chosen[method]["setting"] = beyond[0]
        return chosen
    monkeypatch.setattr(study, "select", prefer_extension)
    out = tmp_path / "study"
    study.main(curve_argv(out, tiny_model_dir, "--methods", "grpo", "--lrs", "1e-3,1e-4", "--extend-grids", "1",
                          "--curve-budgets", "32"))
    results = json.loads((out / "results.json").read_text())
    [beyond] = {r["setting"] for r in results["runs"] if r.get("extension")}
    assert results["selection"]["grpo"]["setting"] == beyond
    points = {p["budget"]: p for p in json.loads((out / "curves.json").read_text())["points"]}
    assert points[16]["setting"] == points[32]["setting"] == beyond and points[16].get("grid_run")
    run_log, curve_log = grid_and_curve_logs(out, "grpo", beyond)
    assert curve_log[:len(run_log)] == run_log and len(curve_log) > len(run_log)  # continued, not retrained
    assert not list(out.glob("runs/*/*/*/checkpoints"))
    # claim 1 pairs an ES method with an RL method: with GRPO alone, untested, said in one line
    assert "Claim 1 at 32 responses: untested. The study has RL methods only." in (out / "learning_curve.md").read_text()


def test_a_hand_over_cut_short_is_finished_and_a_grid_run_without_its_state_is_not_handed_over(tmp_path):
    import shutil

    grid, curve = tmp_path / "grid", tmp_path / "curve"
    (grid / "checkpoints" / "000002").mkdir(parents=True)
    for name in ("trainer_state.json", "trainer.pt"):
        (grid / "checkpoints" / "000002" / name).write_text("{}")
    (grid / "config.yaml").write_text("steps: 2\n")
    (grid / "log.jsonl").write_text(json.dumps({"iteration": 2, "reward_mean": 0.5, "samples": 16}) + "\n")
    assert study_curves.continuable(grid, "grpo") and not study_curves.continuable(grid, "es_full")  # no update log
    curve.mkdir()
    shutil.move(str(grid / "checkpoints"), str(curve / "checkpoints"))  # killed right after moving the checkpoint
    assert not study_curves.continuable(grid, "grpo")
    assert study_curves.hand_over(grid, curve, "grpo")  # the rest is copied now
    assert all((curve / name).is_file() for name in ("config.yaml", "log.jsonl", study_curves.HANDED))
    assert not study_curves.hand_over(grid, tmp_path / "elsewhere", "grpo")  # nothing left to hand: retrain


def test_the_first_budget_is_the_grid_run_and_a_retrained_point_is_checked_against_it():
    def point(method, seed, reward, budget=512, **extra):
        return {"method": method, "label": method.upper(), "setting": "s", "seed": seed, "budget": budget,
                "greedy": {"reward_mean": reward}, "validation": {"seconds": 1.0}, **extra}

    records = [point("es", 0, 0.5), point("ppo", 0, 0.7)]  # the grid's runs
    points = [point("es", 0, 0.5, grid_run=True), point("ppo", 0, 0.65, retrained=True),
              point("ppo", 0, 0.9, budget=1024)]
    line = study_curves.repeats_grid(points, records, 512)
    assert line.startswith("At 512 responses 1 of 2 curves continue their grid run; 1 retrained it")
    assert "PPO seed 0: 0.6500 against the grid's 0.7000." in line and "ES seed" not in line
    # the verdicts read the grid's run at the first budget, the retrained point's own later
    judged = {(p["method"], p["budget"]): p["greedy"]["reward_mean"] for p in study_curves.scored(points, records, 512)}
    assert judged == {("es", 512): 0.5, ("ppo", 512): 0.7, ("ppo", 1024): 0.9}
    # a point trained on another CPU than its grid run says so: bf16 sums differ between CPUs' kernels
    zen4, xeon = ({"cpu": cpu, "cpu_bf16_units": units, "threads": 2}
                  for cpu, units in (("AMD EPYC", "avx512_bf16"), ("Intel Xeon", "amx")))
    records[1]["machines"], points[1]["machines"] = [zen4], [xeon]
    line = study_curves.repeats_grid(points, records, 512)
    assert ("PPO seed 0: 0.6500 against the grid's 0.7000 (trained on CPU Intel Xeon (bf16 units: amx), "
            "the grid's run on CPU AMD EPYC (bf16 units: avx512_bf16)).") in line


def test_the_machines_note_counts_points_per_machine_and_a_point_without_one_gets_its_measurements():
    zen4 = {"cpu": "AMD EPYC", "cpu_bf16_units": "avx512_bf16", "threads": 2}
    xeon = {"cpu": "Intel Xeon", "cpu_bf16_units": "amx_bf16", "threads": 2}
    one = study_curves.machines_note([{"machines": [zen4]}, {"machines": [zen4]}])
    assert one == "Machines that trained the points: CPU AMD EPYC (bf16 units: avx512_bf16): 2 points."
    mixed = study_curves.machines_note([{}, {"machines": [zen4]}, {"machines": [zen4, xeon]}])
    assert "(seconds compare only within one machine: costs are given per machine)" in mixed
    assert "not recorded: 1 point;" in mixed
    assert "CPU AMD EPYC (bf16 units: avx512_bf16) and CPU Intel Xeon (bf16 units: amx_bf16): 1 point." in mixed
    # a point from before machines were recorded: its run's measurements up to it say where it ran
    early = {"method": "ppo", "setting": "s", "seed": 0, "greedy": {"machine": zen4}}
    placed = study_curves.placed([dict(early, budget=512), dict(early, budget=1024, greedy={"machine": xeon})])
    assert [study_curves.machine_of(p) for p in placed] == ["CPU AMD EPYC (bf16 units: avx512_bf16)",
                                                             "several machines"]
    assert "(from its measurements)" in study_curves.machines_note(placed)


def catch_up_points(es_last, rl_first, first=512, last=2048):
    out = []
    for seed in range(4):
        for method, label, rewards in (("es_lowrank", "ES (low-rank)", (0.5, es_last)),
                                       ("es_full", "ES (full-rank)", (0.4, 0.45)),
                                       ("grpo", "GRPO", (rl_first, 0.9)), ("ppo", "PPO", (0.3, 0.3))):
            for budget, reward in zip((first, last), rewards):
                out.append({"method": method, "label": label, "setting": "s", "seed": seed, "budget": budget,
                            "greedy": {"reward_mean": reward + 0.01 * seed},
                            "validation": {"seconds": 1.0, "cpu_seconds": 100.0 * budget / first},
                            "measure_cpu_seconds": 10.0})
    return out


def test_whether_es_catches_up_compares_es_at_the_last_budget_with_rl_at_the_first():
    line = study_curves.catch_up(catch_up_points(es_last=0.6, rl_first=0.7), 512, 2048)
    assert line.startswith("Does ES catch up with 4x the budget? ES (low-rank) at 2048 responses 0.615 ± 0.013 "
                           "against GRPO at 512 responses 0.715 ± 0.013: no: RL at 512 still ahead (p = 0.029).")
    assert ("CPU s per run (runs) per machine: ES (low-rank) to 2048 420 (4) on an unrecorded machine; GRPO to 512 "
            "110 (4) on an unrecorded machine.") in line
    assert "ES (low-rank) +0.100, ES (full-rank) +0.050, GRPO +0.200, PPO +0.000." in line
    assert "yes: ES ahead (p = 0.029)" in study_curves.catch_up(catch_up_points(es_last=0.8, rl_first=0.7), 512, 2048)
    level = catch_up_points(es_last=0.705, rl_first=0.7)  # the seeds overlap: neither side ahead beyond their spread
    assert ": not shown: ES - RL = +0.005, within seed noise (p = 0.686)." in study_curves.catch_up(level, 512, 2048)
    assert study_curves.catch_up([p for p in level if p["method"].startswith("es")], 512, 2048) is None  # no RL
    assert study_curves.catch_up(level, 512, 512) is None


def test_catching_up_must_hold_on_each_machines_points_alone():
    """Round two's case: ES's seed 3 continued on another CPU. A machine that holds one side's points
    only cannot test anything and is left out; the verdict must hold on every machine that holds both.
    And the CPU seconds are given per machine, never averaged over both."""
    zen4, xeon = ({"cpu": cpu, "cpu_bf16_units": units, "threads": 2}
                  for cpu, units in (("AMD EPYC", "avx512_bf16"), ("Intel Xeon", "amx")))
    points = catch_up_points(es_last=0.6, rl_first=0.7)
    for p in points:
        p["machines"] = [xeon if p["seed"] == 3 and p["budget"] == 2048 else zen4]
        p["validation"]["cpu_seconds"] *= 2 if p["machines"] == [xeon] else 1
    line = study_curves.catch_up(points, 512, 2048)
    assert (": no: on each machine's points alone (on CPU AMD EPYC (bf16 units: avx512_bf16), 3 ES against 4 RL "
            "points: no, RL at 512 still ahead (p = 0.029))") in line
    assert "Left out (one side only, or no single machine): CPU Intel Xeon (bf16 units: amx): 1 ES and 0 RL points" in line
    assert ("ES (low-rank) to 2048 420 (3) on CPU AMD EPYC (bf16 units: avx512_bf16), 820 (1) on CPU Intel Xeon "
            "(bf16 units: amx)") in line
    # seed 3 of both sides on the other CPU: pooled, RL is ahead at p = 0.029; 3 seeds a side on one CPU and
    # 1 on the other cannot show it, so: not shown
    for p in points:
        if p["seed"] == 3:
            p["machines"] = [xeon]
    line = study_curves.catch_up(points, 512, 2048)
    assert ": not shown: the verdict must hold on each machine's points alone (p = 0.100, p = 1.000)" in line
    assert "on CPU Intel Xeon (bf16 units: amx), 1 ES against 1 RL points: not shown" in line
    assert "pooled over machines, RL at 512 still ahead (p = 0.029)" in line


def test_catching_up_tells_apart_two_cpus_that_share_a_label_by_their_recorded_numbers():
    """A Zen 1 and a Zen 3 share 'CPU AMD EPYC (bf16 units: none)'. ES's 2048 points on one and RL's 512
    points on the other: no machine holds both sides, whatever the pooled numbers say; costs per CPU."""
    epyc = {"cpu": "AMD EPYC", "cpu_bf16_units": "none", "threads": 2}
    points = catch_up_points(es_last=0.6, rl_first=0.7)
    for p in points:
        p["machines"] = [dict(epyc, cpu_model="family 23 model 1" if p["budget"] == 2048 else "family 25 model 1")]
    line = study_curves.catch_up(points, 512, 2048)
    assert ": not shown: the verdict must hold on each machine's points alone (no machine holds both sides)" in line
    assert "pooled over machines, RL at 512 still ahead (p = 0.029)" in line
    assert "on CPU AMD EPYC (bf16 units: none), family 23 model 1" in line
    for p in points:  # one family and model recorded: the label is one machine, as before the numbers
        p["machines"] = [dict(epyc, cpu_model="family 25 model 1")]
    assert ": no: RL at 512 still ahead (p = 0.029)" in study_curves.catch_up(points, 512, 2048)


def test_curve_budgets_must_be_growing_multiples(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        study.main(curve_argv(tmp_path / "s", tiny_model_dir, "--curve-budgets", "24"))
    err = capsys.readouterr().err
    assert "each budget must be a multiple of --max-samples 16" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()


def test_every_other_method_of_round_three_continues_its_grid_run(tmp_path, tiny_model_dir, one_thread):
    """Round three's other methods continue as es_full and grpo do (above): low-rank ES and ES on
    adapters from their update logs, Dr.GRPO, PPO (with its critic) and GRPO on adapters from their
    newest checkpoints. Each curve's log goes on from its grid run's, and no weights stay behind."""
    methods = ("es_lowrank", "es_lora", "dr_grpo", "ppo", "grpo_lora")
    out = tmp_path / "study"
    study.main(curve_argv(out, tiny_model_dir, "--methods", ",".join(methods), "--lowrank-population", "4",
                          "--lora-rank", "2", "--lora-sigmas", "0.01", "--lora-lrs", "1e-3",
                          "--curve-budgets", "32"))
    results = json.loads((out / "results.json").read_text())
    points = {(p["method"], p["budget"]): p for p in json.loads((out / "curves.json").read_text())["points"]}
    assert sorted(points) == sorted((m, b) for m in methods for b in (16, 32))
    for method in methods:
        setting = results["selection"][method]["setting"]
        assert points[method, 16].get("grid_run") and not points[method, 16].get("retrained")
        assert points[method, 32]["validation"]["samples"] == 32
        run_log, curve_log = grid_and_curve_logs(out, method, setting)
        assert curve_log[:len(run_log)] == run_log and len(curve_log) > len(run_log), method
    assert not list(out.glob("runs/*/*/*/checkpoints")) and not list(out.glob("curves/*/*/*/checkpoints"))
    assert "At 16 responses 5 of 5 curves continue their grid run." in (out / "learning_curve.md").read_text()
