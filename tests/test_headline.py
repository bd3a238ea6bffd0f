"""benchmarks.study.headline: the README's table and claim verdicts from studies' results.json."""

import json
import re
from pathlib import Path

import pytest

from benchmarks.study import headline
from benchmarks.study.verdicts import (QUESTION, Study, claim_budget, claim_hacking, claim_near_zero, claim_seeds,
                                       claim_settings, deviations, per_machine, permutation_p)

LABELS = {"es_full": "ES (full-rank)", "es_lowrank": "ES (low-rank)", "grpo": "GRPO", "dr_grpo": "Dr.GRPO",
          "ppo": "PPO"}


def summary(reward: float, correct: float = 0.5, kl: float | None = None, std: float = 0.0, n: int = 100,
            se: float | None = None) -> dict:
    """A measurement's summary; ``se`` its standard error over distinct prompts (default: every prompt
    distinct, std / sqrt(n))."""
    return {"env": "Toy-v0", "pass@1": correct, "reward_mean": reward, "correct_rate": correct, "kl_mean": kl,
            "parts_mean": {}, "reward_std": std, "n": n, "reward_se": std / n ** 0.5 if se is None else se}


def step_of(key: str, setting: str) -> dict:
    """The hyperparameters a setting name stands for: "lr=1e-05" -> {"lr": 1e-05} (others: none)."""
    return {k: float(v) for k, v in (part.split("=") for part in setting.split("_") if "=" in part)}


def study(rewards: dict[str, dict[str, list[float]]], base: float = 0.5, hacked: dict[str, int] | None = None,
          kl: dict[str, float] | None = None, test_std: float = 0.0, n: int = 100) -> Study:
    """A finished study: ``rewards[method][setting]`` = test rewards over seeds; the first setting is
    selected; ``test_std``: every model's std of reward over the ``n`` test prompts."""
    runs, methods = [], {}
    for key, settings in rewards.items():
        chosen = next(iter(settings))
        for setting, values in settings.items():
            for seed, r in enumerate(values):
                runs.append({"method": key, "label": LABELS[key], "setting": setting, "seed": seed,
                             "hparams": step_of(key, setting), "greedy": summary(r, correct=r, std=test_std, n=n)})
        k = (kl or {}).get(key, 0.01)
        methods[key] = {"label": LABELS[key], "setting": chosen, "test_pass@1": [100 * r for r in settings[chosen]],
                        "test_reward": settings[chosen], "hacked_runs": (hacked or {}).get(key, 0),
                        "runs": sum(len(v) for v in settings.values()),
                        "sampled_reward": settings[chosen], "kl": [k] * len(settings[chosen])}
    results = {"config": {"seeds": 4, "max_samples": 512}, "selected_on": "validation", "wall_seconds_runs": 7200.0,
               "base": {"greedy": summary(base, base, std=test_std, n=n), "kl": summary(base, base, kl=0.0)}, "methods": methods,
               "runs": runs}
    return Study(headline.Path("docs/study-toy"), results)


FLAT = [0.5, 0.5, 0.5, 0.5]


def test_the_permutation_test_is_exact():
    assert permutation_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert permutation_p([1, 1], [1, 1]) == 1.0
    assert permutation_p([0.0, 1.0], [1.0, 0.0]) == 1.0


def test_nothing_moved_leaves_every_claim_untested():
    s = study({"es_full": {"alpha=1": FLAT, "alpha=2": FLAT}, "grpo": {"lr=1": [0.5, 0.52, 0.48, 0.5], "lr=2": FLAT}})
    for rule in (claim_budget, claim_seeds, claim_settings, claim_hacking):
        verdict, numbers = rule(s)
        assert verdict == "untested", (rule, numbers)


def test_moved_needs_the_gain_beyond_the_seeds_and_the_test_sets_standard_error():
    tight = {"es_full": {"a": [0.6, 0.61, 0.59, 0.6]}, "grpo": {"x": FLAT}}
    assert study(tight, test_std=0.1, n=100).moved("es_full")  # gain 0.1 > 2 x 0.01
    few_prompts = study(tight, test_std=0.5, n=8)  # 2 x 0.5 / sqrt(8) = 0.35: one prompt's worth is no gain
    assert not few_prompts.moved("es_full") and few_prompts.test_se("es_full") == pytest.approx(0.5 / 8 ** 0.5)
    assert not study({"es_full": {"a": [0.3, 0.9, 0.5, 0.7]}}).moved("es_full")  # gain 0.1 < 2 x seed std


def test_the_budget_claim_is_symmetric():
    es_ahead = study({"es_full": {"a": [0.9, 0.91, 0.89, 0.9]}, "grpo": {"x": [0.6, 0.61, 0.59, 0.6]}})
    verdict, numbers = claim_budget(es_ahead)
    assert verdict == "held" and "p = 0.029" in numbers
    rl_ahead = study({"es_full": {"a": [0.6, 0.61, 0.59, 0.6]}, "grpo": {"x": [0.9, 0.91, 0.89, 0.9]}})
    verdict, numbers = claim_budget(rl_ahead)
    assert verdict == "failed" and "p = 0.029" in numbers
    # ES ahead by a margin the seeds do not support: not held (the old rule said "held" for any lead)
    es_noisy = study({"es_full": {"a": [0.95, 0.6, 1.0, 0.7]}, "grpo": {"x": [0.7, 0.71, 0.69, 0.7]}})
    assert claim_budget(es_noisy)[0] == "not shown"
    rl_noisy = study({"es_full": {"a": [0.7, 0.71, 0.69, 0.7]}, "grpo": {"x": [0.6, 1.0, 0.65, 0.95]}})
    assert claim_budget(rl_noisy)[0] == "not shown"


def test_the_seed_claim_is_pairwise_symmetric_and_one_outlier_cannot_decide_it():
    wide, tight = [0.6, 0.9, 0.65, 0.95], [0.8, 0.81, 0.79, 0.8]
    s = study({"es_full": {"a": tight}, "es_lowrank": {"a": [0.8, 0.8, 0.81, 0.79]}, "grpo": {"x": wide},
               "ppo": {"x": [0.95, 0.6, 0.9, 0.7]}})
    verdict, numbers = claim_seeds(s)
    assert verdict == "held" and numbers.count("p = 0.029") == 4  # 2 ES x 2 RL pairs
    assert claim_seeds(study({"es_full": {"a": wide}, "grpo": {"x": tight}}))[0] == "failed"
    # GRPO's one collapsed seed: its mean std is far larger, but the deviations from the median say
    # one seed, and a permutation test cannot make one value significant
    collapsed = [0.2, 0.8, 0.81, 0.8]
    assert deviations(collapsed) == pytest.approx([0.6, 0.0, 0.01, 0.0])
    s = study({"es_full": {"a": [0.75, 0.8, 0.85, 0.8]}, "grpo": {"x": collapsed}})
    verdict, numbers = claim_seeds(s)
    assert verdict == "not shown", numbers
    # pairs that disagree: not shown either way
    s = study({"es_full": {"a": tight}, "grpo": {"x": wide}, "ppo": {"x": [0.9, 0.901, 0.899, 0.9]},
               "es_lowrank": {"a": [0.6, 0.9, 0.65, 0.95]}})
    assert claim_seeds(s)[0] == "not shown"


def grid(name: str, values: dict[float, list[float]]) -> dict[str, list[float]]:
    """A step-size grid: setting "NAME=STEP" -> test rewards over seeds, in the order given (the first
    is the selected setting)."""
    return {f"{name}={step:g}": rewards for step, rewards in values.items()}


STEADY, STEEP = [0.8, 0.81, 0.79, 0.8], [0.6, 0.62, 0.61, 0.6]


def test_the_settings_claim_reads_three_step_sizes_around_the_selected_one_and_is_symmetric():
    flat_es = grid("alpha", {1e-3: STEADY, 3.3333333333e-4: [0.8, 0.8, 0.81, 0.8], 3e-3: [0.79, 0.8, 0.8, 0.81]})
    steep_rl = grid("lr", {3e-6: STEADY, 1e-6: STEEP, 9e-6: [0.5, 0.52, 0.51, 0.5]})
    verdict, numbers = claim_settings(study({"es_full": flat_es, "grpo": steep_rl}))
    assert verdict == "held" and "x3 apart" in numbers and "p = 0.029" in numbers
    steep_es = grid("alpha", {1e-3: STEADY, 3.3333333333e-4: STEEP, 3e-3: [0.5, 0.52, 0.51, 0.5]})
    flat_rl = grid("lr", {3e-6: STEADY, 1e-6: [0.8, 0.8, 0.81, 0.8], 9e-6: [0.79, 0.8, 0.8, 0.81]})
    assert claim_settings(study({"es_full": steep_es, "grpo": flat_rl}))[0] == "failed"


def test_an_extended_grid_is_read_on_the_same_window_as_the_others():
    """ES's grid extended to 4 step sizes (its selection sat at an edge, the study added one beyond it):
    claim 3 reads the selected step size and its two neighbours, as for RL's 3, so the step it never
    selected (x9 away, where its reward collapses) does not count against it."""
    extended = grid("alpha", {1e-3: STEADY, 3.3333333333e-4: [0.8, 0.8, 0.81, 0.8], 3e-3: [0.79, 0.8, 0.8, 0.81],
                              9e-3: [0.1, 0.12, 0.11, 0.1]})
    steep_rl = grid("lr", {3e-6: STEADY, 1e-6: STEEP, 9e-6: [0.5, 0.52, 0.51, 0.5]})
    found = claim_settings(study({"es_full": extended, "grpo": steep_rl}))
    assert found.verdict == "held" and "ES (full-rank) 4 x27" in found.numbers
    # the same grid, its selection at the bottom edge: no window, no verdict, and the gate says so
    at_edge = dict(sorted(extended.items(), key=lambda kv: float(kv[0].split("=")[1])))  # the smallest selected
    found = claim_settings(study({"es_full": at_edge, "grpo": steep_rl}))
    assert found.verdict == "not shown, grids differ" and "sits at its grid's edge" in found.numbers


def test_grids_that_differ_give_no_settings_verdict_and_say_what_the_gate_hid():
    flat_es = {"alpha=0.001": STEADY, "alpha=0.006": [0.8, 0.8, 0.81, 0.8]}
    steep_rl = {"lr=1e-06": STEADY, "lr=6e-06": STEEP}
    found = claim_settings(study({"es_full": flat_es, "grpo": steep_rl}))  # round two's 2-point grids
    assert found.verdict == "not shown, grids differ" and "has 2 step sizes, fewer than 3" in found.numbers
    assert found.ungated == "held" and "without it, over the whole grids: held" in found.gate
    three_es = grid("alpha", {1e-3: STEADY, 3.3333333333e-4: STEADY, 3e-3: STEADY})
    ten_rl = grid("lr", {1e-5: STEADY, 1e-6: STEEP, 1e-4: STEEP})  # x10 apart against ES's x3
    found = claim_settings(study({"es_full": three_es, "grpo": ten_rl}))
    assert found.verdict == "not shown, grids differ" and "the grids' factors differ" in found.numbers
    beta_grid = {"beta=0_lr=1e-05": STEADY, "beta=0.001_lr=1e-05": STEEP, "beta=0.01_lr=1e-05": STEEP}
    found = claim_settings(study({"es_full": three_es, "grpo": beta_grid}))  # a grid over beta: not the step size
    assert found.verdict == "not shown, grids differ" and "GRPO varies more than its step size" in found.numbers


def test_hacking_counts_hacked_runs_then_reads_reward_against_kl():
    moved = {"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": [0.8, 0.82, 0.78, 0.8]}}
    assert claim_hacking(study(moved, hacked={"grpo": 2}))[0] == "held"
    assert claim_hacking(study(moved, hacked={"es_full": 1}))[0] == "failed"
    verdict, numbers = claim_hacking(study(moved, kl={"es_full": 0.001, "grpo": 0.05}))
    assert verdict == "held" and "dominates" in numbers
    verdict, numbers = claim_hacking(study(moved, kl={"es_full": 0.05, "grpo": 0.001}))
    assert verdict == "failed" and "dominates" in numbers
    assert claim_hacking(study(moved, kl={"es_full": 0.01, "grpo": 0.01}))[0] == "not shown"


def test_hacking_needs_both_sides_moved_and_is_symmetric_in_effect():
    """ES moved with 1 of 4 runs hacked and RL did not move: the old rule said "failed", while the
    mirror (RL moved and hacked, ES did not move) was "untested". Both are untested now, and each
    finding says what the gate hid, the one the mirror of the other."""
    up, flat = {"a": [0.8, 0.81, 0.79, 0.8]}, {"a": FLAT}
    es_moved = claim_hacking(study({"es_full": up, "grpo": flat}, hacked={"es_full": 1}))
    rl_moved = claim_hacking(study({"es_full": flat, "grpo": up}, hacked={"grpo": 1}))
    assert (es_moved.verdict, rl_moved.verdict) == ("untested", "untested")
    assert (es_moved.ungated, rl_moved.ungated) == ("failed", "held")
    assert "moved: ES ES (full-rank), RL none" in es_moved.numbers and "moved: ES none, RL GRPO" in rl_moved.numbers
    # both sides moved: only the methods that moved are counted (an unmoved ES method's hacked run is not ES's)
    both = {"es_full": up, "es_lowrank": flat, "grpo": {"a": [0.8, 0.81, 0.79, 0.8]}}
    assert claim_hacking(study(both, hacked={"es_lowrank": 1})).verdict == "not shown"
    assert claim_hacking(study(both, hacked={"es_full": 1})).verdict == "failed"
    assert claim_hacking(study(both, hacked={"grpo": 1})).verdict == "held"


def test_the_block_is_the_table_and_one_line_per_claim_and_the_details_hold_the_numerics(tmp_path):
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": FLAT}})
    for r in s.results["runs"]:
        r.update(runtime=["cpu bfloat16"], engines=["native"], shared_prefix="on" if r["method"] == "grpo" else None)
    for summary_ in s.results["base"].values():
        summary_.update(device="cpu", dtype="bfloat16", engine="native")
    text = headline.headline([s], "docs/study/round-two.md")
    assert "| Base model | 50.0 | 0.500 |" in text
    assert "| ES (full-rank) | 80.0 ± 0.8 | 0.800 ± 0.008 * |" in text and "| GRPO | 50.0 ± 0.0 | 0.500 ± 0.000 |" in text
    assert "[Toy-v0](docs/study-toy/) 4 x 512" in text
    claims = [line for line in text.splitlines() if re.match(r"\d\. \*\*", line)]
    assert len(claims) == 4 and claims[0].startswith("1. **ES matches or beats RL at the same budget: held.**")
    assert "Toy-v0: held, ES (full-rank) against GRPO, p = 0.029" in claims[0]
    assert claims[0].endswith("([every number](docs/study/round-two.md#claim-1-es-matches-or-beats-rl-at-the-same-budget)).")
    # GRPO did not learn: no pair, no p; what the gate hid, in a few words
    assert "Toy-v0: untested (without its gate: not shown, ES less at p < 0.05 in 0 of 1 pairs, more in 0) ([" in claims[1]
    assert "Toy-v0: untested, 0 of 8 runs hacked (without its gate: held)" in claims[3]  # GRPO did not move
    assert "training cpu bfloat16" not in text and " h** of training" not in text  # the numerics go to the page
    page = headline.details([s], Path("docs/study"))
    assert "training cpu bfloat16; engine: native; RL updates with the shared prefix on" in page
    assert "**2.0 h** of training" in page and "Toy-v0: ES (full-rank) beat the base model" in page
    assert "[`docs/study-toy`](../study-toy/)" in page  # links from the page's folder
    assert page.count("\n### Claim ") == 4 and "### Claim 1: ES matches or beats RL at the same budget\n" in page
    assert "- Toy-v0: held. ES (full-rank) 0.800 ± 0.008 against GRPO 0.500 ± 0.000 (p = 0.029)." in page


def test_pairwise_claims_count_the_pairs_that_pass_the_test():
    wide, tight = [0.6, 0.9, 0.65, 0.95], [0.8, 0.81, 0.79, 0.8]
    s = study({"es_full": {"a": tight}, "es_lowrank": {"a": [0.8, 0.8, 0.81, 0.79]}, "grpo": {"x": wide},
               "ppo": {"x": [0.95, 0.6, 0.9, 0.7]}})
    line = headline.claim_lines([s], None)[1]
    assert line == "2. **ES varies less from seed to seed: held.** Toy-v0: held, p < 0.05 in 4 of 4 pairs (p = 0.029-0.029)."
    # "not shown" with significant pairs says which way they went: here ES varies more, not less
    s = study({"es_full": {"a": wide}, "es_lowrank": {"a": [0.8, 0.8, 0.81, 0.79]}, "grpo": {"x": tight},
               "ppo": {"x": [0.8, 0.8, 0.8, 0.81]}})
    line = headline.claim_lines([s], None)[1]
    assert line == ("2. **ES varies less from seed to seed: not shown.** Toy-v0: not shown, ES less at p < 0.05 in 0 "
                    "of 4 pairs, more in 2 (p = 0.029-1.000).")


def test_the_directions_add_up_over_machines_and_cover_every_pair_or_are_not_said():
    both = ("on A (8 runs): not shown, x; ES significantly less in 1 of 4 pairs, more in 2; "
            "on B (8 runs): not shown, y; ES significantly less in 0 of 4 pairs, more in 1")
    assert headline.directions(both, 8) == "ES less at p < 0.05 in 1 of 8 pairs, more in 3"
    # a machine that held names no direction: a count over half the pairs would mislead
    one = "on A (8 runs): held, x; on B (8 runs): not shown, y; ES significantly less in 0 of 4 pairs, more in 1"
    assert headline.directions(one, 8) is None and headline.directions("held, x", 4) is None


def test_the_readme_block_and_the_details_page_are_rewritten_and_bad_input_is_a_clear_error(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{headline.START}\nold\n{headline.END}\nrest\n")
    page = tmp_path / "docs" / "study" / "round-two.md"
    page.parent.mkdir(parents=True)
    page.write_text(f"# Round two\n{headline.DETAILS_START}\nold\n{headline.DETAILS_END}\nend\n")
    out = tmp_path / "study"
    out.mkdir()
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": FLAT}})
    (out / "results.json").write_text(json.dumps(s.results))
    headline.main([str(out), "--readme", str(readme), "--details", str(page)])
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text and "| GRPO |" in text
    assert "(docs/study/round-two.md#claim-1-es-matches-or-beats-rl-at-the-same-budget)" in text
    assert "[Toy-v0](study/) 4 x 512" in text  # the study's directory, from the README's folder
    written = page.read_text()
    assert written.startswith("# Round two\n") and written.endswith("end\n") and "old" not in written
    assert "### Claim 4: ES reward-hacks less" in written and "(../../study/)" in written
    with pytest.raises(SystemExit):
        headline.main([str(tmp_path / "nothing")])
    assert "no results.json" in capsys.readouterr().err
    (tmp_path / "plain.md").write_text("no markers")
    readme.write_text(f"{headline.START}\nold\n{headline.END}\n")
    with pytest.raises(SystemExit):  # the page has no details markers: neither file is written
        headline.main([str(out), "--readme", str(readme), "--details", str(tmp_path / "plain.md")])
    assert "headline-details:start" in capsys.readouterr().err and "old" in readme.read_text()
    page.write_text(f"{headline.DETAILS_START}\nold\n{headline.DETAILS_END}\n")
    with pytest.raises(SystemExit):  # the README has no markers: the page is not written either
        headline.main([str(out), "--readme", str(tmp_path / "plain.md"), "--details", str(page)])
    assert "headline:start" in capsys.readouterr().err and "old" in page.read_text()
    with pytest.raises(SystemExit):
        headline.main([str(out), "--readme", str(tmp_path / "missing.md")])
    assert "missing.md: no such file" in capsys.readouterr().err


def test_learning_curves_are_one_line_in_the_block_and_whole_on_the_page(tmp_path):
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": FLAT}})
    s.path = tmp_path
    assert "Learning curves" not in headline.headline([s]) and "Learning curves" not in headline.details([s], tmp_path)
    verdicts = ["Claim 1 at 512 responses: failed. ES 0.5 against RL 0.7 (p = 0.029).",
                "Claim 1 at 2048 responses: not shown. y (p = 0.200); RL ahead within seed noise."]
    (tmp_path / "curves.json").write_text(json.dumps({"budgets": [512, 2048], "points": [], "verdicts": verdicts}))
    line = headline.headline([s]).splitlines()[-1]
    assert line == (f"- **Learning curves, Toy-v0** ([learning_curve.md]({headline.link(tmp_path, Path('.'))}/"
                    "learning_curve.md)): claim 1 at 512 responses: failed, p = 0.029; at 2048: not shown, p = 0.200.")
    repeats = "At 512 responses each curve retrains its grid run: 1 of 2 points repeat; PPO seed 2 (trained on CPU X)."
    (tmp_path / "curves.json").write_text(json.dumps({
        "budgets": [512, 2048], "points": [], "verdicts": verdicts, "repeats_grid": repeats,
        "catch_up": "Does ES catch up with 4x the budget? ES at 2048 0.6 against PPO at 512 0.7: no: RL at 512 still "
                    "ahead (p = 0.029). Mean test reward gained: ES +0.1."}))
    text = headline.headline([s])
    assert text.rstrip().endswith("Does ES catch up with 4x the budget? no: RL at 512 still ahead (p = 0.029).")
    assert "CPU X" not in text  # which machine trained which point: the page's, not the README's
    page = headline.details([s], tmp_path)
    assert "![Toy-v0: learning curves](./learning_curve.png)" in page
    assert f"- {verdicts[1]}" in page and f"- {repeats}" in page and "- Does ES catch up" in page


UP, BASE5 = [0.3, 0.31, 0.29, 0.3], [0.05, 0.05, 0.05, 0.05]


def test_the_near_zero_question_is_a_symmetric_rule_tested_both_ways():
    """Round three's pre-registered question on made-up results: held when ES moves from a near-zero
    base and no RL method does (and ES beats each at p < 0.05), failed in the mirror case, not shown
    when both move or a lead is within seed noise, untested when nothing moves or the base is not near zero."""
    def near(es, rl, base=0.05):
        return study({"es_full": {"a": es}, "grpo": {"x": rl}, "dr_grpo": {"x": rl}, "ppo": {"x": rl}}, base=base)

    held = claim_near_zero(near(UP, BASE5))
    assert held.verdict == "held" and held.numbers.count("p = 0.029") == 3 and "moved: ES (full-rank)" in held.numbers
    failed = claim_near_zero(near(BASE5, UP))
    assert failed.verdict == "failed" and "GRPO against ES (full-rank) p = 0.029" in failed.numbers
    assert claim_near_zero(near(UP, UP)).verdict == "not shown"  # both improved: not "where RL does not"
    noisy_rl = [0.05, 0.32, 0.05, 0.06]  # did not move (its seeds spread), but ES's lead is within their noise
    found = claim_near_zero(near(UP, noisy_rl))
    assert found.verdict == "not shown" and "within seed noise" in found.numbers
    assert claim_near_zero(near(BASE5, BASE5)).verdict == "untested"
    assert "not near zero" in claim_near_zero(near([0.8] * 4, [0.5] * 4, base=0.5)).numbers


def test_the_question_line_names_the_rules_commit_for_a_near_zero_study():
    s = study({"es_full": {"a": UP}, "grpo": {"x": BASE5}}, base=0.05)
    s.results["config"]["rule_commit"] = "0123456789abcdef0123456789abcdef01234567"
    text = headline.headline([s])
    assert (f"- **{QUESTION} held.** Toy-v0: base pass@1 5.0%" in text
            and "(rule pre-registered in commit 0123456789ab)." in text)
    assert QUESTION not in headline.headline([study({"es_full": {"a": UP}, "grpo": {"x": BASE5}})])  # base 0.5


def test_the_question_line_says_when_the_rule_changed_after_its_commit():
    """The commit before the newest change to verdicts.py: that change is named; from the newest
    change itself, none (a copy without git history names none either)."""
    import subprocess

    log = subprocess.run(["git", "log", "-1", "--format=%H", "--", "benchmarks/study/verdicts.py"],
                         capture_output=True, text=True)
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip("no git history here")
    newest = log.stdout.strip()
    assert newest[:7] in " ".join(headline.amendments(newest + "^"))
    assert headline.amendments(newest) == []
    s = study({"es_full": {"a": UP}, "grpo": {"x": BASE5}}, base=0.05)
    s.results["config"]["rule_commit"] = newest + "^"
    assert "; `verdicts.py` changed since in " in headline.headline([s])


def test_a_verdict_over_several_machines_must_hold_on_each_alone():
    """Seeds 0-1 trained on one CPU and seeds 2-3 on another: pooled, ES is ahead at p = 0.029; on each
    machine alone 2 seeds a side cannot show it, so the verdict is "not shown"."""
    s = study({"es_full": {"a": [0.9, 0.91, 0.89, 0.9]}, "grpo": {"x": [0.6, 0.61, 0.59, 0.6]}})
    assert claim_budget(s).verdict == "held" and per_machine(claim_budget)(s).verdict == "held"  # one machine
    for r in s.results["runs"]:
        r["machines"] = [{"cpu": "A" if r["seed"] < 2 else "B", "cpu_bf16_units": "x", "threads": 2}]
    found = per_machine(claim_budget)(s)
    assert found.verdict == "not shown" and "The runs trained on 2 machines" in found.numbers
    assert "on CPU A (bf16 units: x) (4 runs): not shown" in found.numbers and "p = 0.333" in found.numbers
    # every run on one machine, whatever its thread count: one machine
    for r in s.results["runs"]:
        r["machines"] = [{"cpu": "A", "cpu_bf16_units": "x", "threads": 2 + r["seed"]}]
    assert per_machine(claim_budget)(s).verdict == "held"


def test_two_cpus_that_share_a_label_are_two_machines_once_their_records_say_which():
    """A Zen 1 and a Zen 3 are both 'CPU AMD EPYC (bf16 units: none)'. Records hold the CPU's family and
    model since 2026-12-02: where a study's records name two under one label, each is its own machine,
    and a run from before the numbers (it could be either) belongs to neither; where they name one, the
    label is one machine, as before."""
    s = study({"es_full": {"a": [0.9, 0.91, 0.89, 0.9]}, "grpo": {"x": [0.6, 0.61, 0.59, 0.6]}})
    epyc = {"cpu": "AMD EPYC", "cpu_bf16_units": "none", "threads": 2}
    for r in s.results["runs"]:
        r["machines"] = [dict(epyc, cpu_model="family 25 model 1" if r["seed"] < 2 else "family 23 model 1")]
    found = per_machine(claim_budget)(s)
    assert found.verdict == "not shown" and "The runs trained on 2 machines" in found.numbers
    assert "on CPU AMD EPYC (bf16 units: none), family 23 model 1 (4 runs): not shown" in found.numbers
    for r in s.results["runs"]:  # seed 0 from before the numbers: it could be either CPU's, so it is left out
        if r["seed"] == 0:
            r["machines"] = [dict(epyc)]
    found = per_machine(claim_budget)(s)
    assert found.verdict == "not shown" and "2 runs trained on no single machine the records name, left out" \
        in found.numbers and "on CPU AMD EPYC (bf16 units: none), family 25 model 1 (2 runs)" in found.numbers
    for r in s.results["runs"]:  # one family and model under the label: one machine, as before the numbers
        r["machines"] = [dict(epyc, cpu_model="family 25 model 1")] if r["seed"] >= 2 else [dict(epyc)]
    assert per_machine(claim_budget)(s).verdict == "held"


def test_a_study_on_several_machines_says_what_its_gates_hid_as_one_machine_does():
    """The README's claim lines print "(without its gate: ...)" for a study that trained on two
    machines too (round three's claim 4 on products hid "failed")."""
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8], "b": FLAT}, "grpo": {"x": FLAT}})
    for r in s.results["runs"]:  # each run's sampled measurement, which a machine's part reads
        r["kl"] = summary(r["greedy"]["reward_mean"], kl=0.01)
    one = headline.claim_lines([s], None)
    for r in s.results["runs"]:  # setting b, not selected, on another machine: it abstains
        r["machines"] = [{"cpu": "B" if r["setting"] == "b" else "A", "cpu_bf16_units": "x", "threads": 2}]
    two = headline.claim_lines([s], None)
    assert "(without its gate: not shown, ES less at p < 0.05 in 0 of 1 pairs, more in 0)" in one[1] and \
        "(without its gate: not shown, ES less at p < 0.05 in 0 of 1 pairs, more in 0)" in two[1]
    assert "(without its gate: held)" in one[3] and "(without its gate: held)" in two[3]
    found = per_machine(claim_seeds)(s)
    assert found.verdict == "untested" and found.ungated == "not shown" and "on CPU A (bf16 units: x): not shown" \
        in found.ungated_numbers


def test_a_machine_with_no_run_at_a_selected_setting_abstains():
    """Round three's first 7 runs, all at settings not selected, trained on another CPU: nothing the
    verdict compares trained there, so that machine neither holds nor vetoes it; a machine with selected
    runs of one side only still makes it "not shown" (the comparison would span machines)."""
    s = study({"es_full": {"sigma=0.001_alpha=0.0045": [0.9, 0.91, 0.89, 0.9], "sigma=0.001_alpha=0.0015": FLAT},
               "grpo": {"lr=1e-05": [0.6, 0.61, 0.59, 0.6]}})
    for r in s.results["runs"]:
        other = r["setting"] == "sigma=0.001_alpha=0.0015"
        r["machines"] = [{"cpu": "B" if other else "A", "cpu_bf16_units": "x", "threads": 2}]
    found = per_machine(claim_budget)(s)
    assert found.verdict == "held" and "The runs trained on 2 machines" in found.numbers
    assert "on CPU B (bf16 units: x) (4 runs): none at a selected setting, so it abstains" in found.numbers
    s.results["runs"][0]["machines"] = [{"cpu": "B", "cpu_bf16_units": "x", "threads": 2}]  # a selected ES seed
    assert per_machine(claim_budget)(s).verdict == "not shown"
