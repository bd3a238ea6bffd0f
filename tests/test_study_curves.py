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


def test_curves_continue_the_selected_settings_and_resume(tmp_path, tiny_model_dir, one_thread, kill_on_call):
    out = tmp_path / "study"
    study.main(curve_argv(out, tiny_model_dir))  # the grid alone
    assert not (out / "curves").exists()
    with kill_on_call(study_curves, "continue_to", 2):  # killed on its way to the second budget of a run
        study.main(curve_argv(out, tiny_model_dir, "--curve-budgets", "32,48"))
    study.main(curve_argv(out, tiny_model_dir, "--curve-budgets", "32,48"))  # resumes at the next budget

    curves = json.loads((out / "curves.json").read_text())
    assert curves["budgets"] == [16, 32, 48]
    points = curves["points"]
    assert sorted((p["method"], p["budget"]) for p in points) == [(m, b) for m in ("es_full", "grpo")
                                                                   for b in (16, 32, 48)]
    for p in points:
        assert p["validation"]["samples"] == p["budget"] and p["greedy"]["split"] == "test" and "kl" in p
        assert p["validation"]["cpu_seconds"] > 0 and p["measure_cpu_seconds"] > 0  # what each point cost
        assert p["machines"] and p["machines"][0]["cpu"]  # and where, since seconds compare within one machine
        assert (out / "curves" / p["method"] / p["setting"] / "seed=0" / f"completions-{p['budget']}.jsonl.gz").is_file()
    # the first point continues the run the tables report: the grid's numbers again
    grid = {r["method"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    for p in (p for p in points if p["budget"] == 16):
        assert p["greedy"]["reward_mean"] == pytest.approx(grid[p["method"]]["greedy"]["reward_mean"], abs=1e-6)
        assert p["validation"]["eval_reward"] == pytest.approx(grid[p["method"]]["validation"]["eval_reward"], abs=1e-6)
    text = (out / "learning_curve.md").read_text()
    assert "At 16 responses each curve retrains its grid run: 2 of 2 points repeat the grid's test reward." in text
    assert "Machines that trained the points: CPU " in text and ": 6 points." in text
    assert text.count("| ES (full-rank) |") == 3 and "Claim 1 at 48 responses:" in text
    assert "Does ES catch up with 3x the budget? ES (full-rank) at 48 responses" in text
    assert curves["catch_up"] in text and curves["repeats_grid"] in text
    es_rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ES (full-rank) |")]
    assert all(float(row[-1]) >= 0 and float(row[-2]) >= 0 for row in es_rows)  # wall and CPU s per run: numbers
    assert (out / "learning_curve.png").stat().st_size > 0
    assert not list(out.glob("curves/*/*/*/final"))  # weights deleted once every budget is measured
    assert "curve_budgets" not in json.loads((out / "study.json").read_text())  # an extension, not the grid
    # the curve's completions are evidence too: counted, and rescored to the same table
    from benchmarks.study import evidence

    assert evidence.main([str(out)]).count("(curve)") == 2 * 3 * 2  # 2 methods x 3 budgets x (greedy, kl)
    evidence.main([str(out), "--rescore", str(tmp_path / "rescored")])
    assert (tmp_path / "rescored" / "learning_curve.md").read_text() == text
    # and re-rendered in place from curves.json, as the study wrote them
    before = (out / "curves.json").read_text()
    (out / "learning_curve.md").write_text("stale")
    study_rerender.main([str(out)])
    assert (out / "learning_curve.md").read_text() == text and (out / "curves.json").read_text() == before


def test_the_first_budget_is_checked_against_the_grid_run_it_retrains():
    def point(method, seed, reward, budget=512):
        return {"method": method, "label": method.upper(), "setting": "s", "seed": seed, "budget": budget,
                "greedy": {"reward_mean": reward}}

    records = [point("es", 0, 0.5), point("ppo", 0, 0.7)]  # the grid's runs
    points = [point("es", 0, 0.5), point("ppo", 0, 0.65), point("ppo", 0, 0.9, budget=1024)]
    line = study_curves.repeats_grid(points, records, 512)
    assert line.startswith("At 512 responses each curve retrains its grid run: 1 of 2 points repeat")
    assert "PPO seed 0: 0.6500 against the grid's 0.7000." in line and "ES seed" not in line
    # a point trained on another CPU than its grid run says so: bf16 sums differ between CPUs' kernels
    zen4, xeon = ({"cpu": cpu, "cpu_bf16_units": units, "threads": 2}
                  for cpu, units in (("AMD EPYC", "avx512_bf16"), ("Intel Xeon", "amx")))
    records[1]["machines"], points[1]["machines"] = [zen4], [xeon]
    line = study_curves.repeats_grid(points, records, 512)
    assert ("PPO seed 0: 0.6500 against the grid's 0.7000 (trained on CPU Intel Xeon (bf16 units: amx), "
            "the grid's run on CPU AMD EPYC (bf16 units: avx512_bf16)).") in line


def test_the_machines_note_counts_points_per_machine_and_warns_when_they_mix():
    zen4 = {"cpu": "AMD EPYC", "cpu_bf16_units": "avx512_bf16", "threads": 2}
    xeon = {"cpu": "Intel Xeon", "cpu_bf16_units": "amx_bf16", "threads": 2}
    one = study_curves.machines_note([{"machines": [zen4]}, {"machines": [zen4]}])
    assert one == "Machines that trained the points: CPU AMD EPYC (bf16 units: avx512_bf16): 2 points."
    mixed = study_curves.machines_note([{}, {"machines": [zen4]}, {"machines": [zen4, xeon]}])
    assert "(seconds per run then average over machines)" in mixed and "not recorded: 1 point;" in mixed
    assert "CPU AMD EPYC (bf16 units: avx512_bf16) and CPU Intel Xeon (bf16 units: amx_bf16): 1 point." in mixed


def test_whether_es_catches_up_compares_es_at_the_last_budget_with_rl_at_the_first():
    def points(es_last, rl_first, first=512, last=2048):
        out = []
        for seed in range(4):
            for method, label, rewards in (("es_lowrank", "ES (low-rank)", (0.5, es_last)),
                                           ("es_full", "ES (full-rank)", (0.4, 0.45)),
                                           ("grpo", "GRPO", (rl_first, 0.9)), ("ppo", "PPO", (0.3, 0.3))):
                for budget, reward in zip((first, last), rewards):
                    out.append({"method": method, "label": label, "seed": seed, "budget": budget,
                                "greedy": {"reward_mean": reward + 0.01 * seed},
                                "validation": {"cpu_seconds": 100.0 * budget / first}, "measure_cpu_seconds": 10.0})
        return out

    line = study_curves.catch_up(points(es_last=0.6, rl_first=0.7), 512, 2048)
    assert line.startswith("Does ES catch up with 4x the budget? ES (low-rank) at 2048 responses 0.615 ± 0.013, "
                           "420 CPU s per run against GRPO at 512 responses 0.715 ± 0.013, 110 CPU s per run: "
                           "no: RL at 512 still ahead (p = 0.029).")
    assert "ES (low-rank) +0.100, ES (full-rank) +0.050, GRPO +0.200, PPO +0.000." in line
    assert "yes: ES ahead (p = 0.029)" in study_curves.catch_up(points(es_last=0.8, rl_first=0.7), 512, 2048)
    level = points(es_last=0.705, rl_first=0.7)  # the seeds overlap: neither side ahead beyond their spread
    assert ": not shown: ES - RL = +0.005, within seed noise (p = 0.686)." in study_curves.catch_up(level, 512, 2048)
    assert study_curves.catch_up([p for p in level if p["method"].startswith("es")], 512, 2048) is None  # no RL
    assert study_curves.catch_up(level, 512, 512) is None


def test_curve_budgets_must_be_growing_multiples(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        study.main(curve_argv(tmp_path / "s", tiny_model_dir, "--curve-budgets", "24"))
    err = capsys.readouterr().err
    assert "each budget must be a multiple of --max-samples 16" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()
