"""benchmarks.headline: the README's table and claim verdicts from studies' results.json."""

import json

import pytest

from benchmarks import headline
from benchmarks.headline import Study, claim_budget, claim_hacking, claim_seeds, claim_settings, permutation_p

LABELS = {"es_full": "ES (full-rank)", "es_lowrank": "ES (low-rank)", "grpo": "GRPO", "dr_grpo": "Dr.GRPO",
          "ppo": "PPO"}


def summary(reward: float, correct: float = 0.5, kl: float | None = None) -> dict:
    return {"env": "Toy-v0", "pass@1": correct, "reward_mean": reward, "correct_rate": correct, "kl_mean": kl,
            "parts_mean": {}}


def study(rewards: dict[str, dict[str, list[float]]], base: float = 0.5, hacked: dict[str, int] | None = None,
          kl: dict[str, float] | None = None) -> Study:
    """A finished study: ``rewards[method][setting]`` = test rewards over seeds; the first setting is selected."""
    runs, methods = [], {}
    for key, settings in rewards.items():
        chosen = next(iter(settings))
        for setting, values in settings.items():
            for seed, r in enumerate(values):
                runs.append({"method": key, "label": LABELS[key], "setting": setting, "seed": seed,
                             "greedy": summary(r, correct=r)})
        k = (kl or {}).get(key, 0.01)
        methods[key] = {"label": LABELS[key], "setting": chosen, "test_pass@1": [100 * r for r in settings[chosen]],
                        "test_reward": settings[chosen], "hacked_runs": (hacked or {}).get(key, 0),
                        "runs": sum(len(v) for v in settings.values()),
                        "sampled_reward": settings[chosen], "kl": [k] * len(settings[chosen])}
    results = {"config": {"seeds": 4, "max_samples": 512}, "selected_on": "validation", "wall_seconds_runs": 7200.0,
               "base": {"greedy": summary(base, base), "kl": summary(base, base, kl=0.0)}, "methods": methods,
               "runs": runs}
    return Study(headline.Path("docs/study-toy"), results)


FLAT = [0.5, 0.5, 0.5, 0.5]


def test_the_permutation_test_is_exact():
    assert permutation_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert permutation_p([1, 1], [1, 1]) == 1.0
    assert permutation_p([0.0, 1.0], [1.0, 0.0]) == 1.0


def test_nothing_moved_leaves_every_claim_untested():
    s = study({"es_full": {"a": FLAT, "b": FLAT}, "grpo": {"x": [0.5, 0.52, 0.48, 0.5], "y": FLAT}})
    for rule in (claim_budget, claim_seeds, claim_settings, claim_hacking):
        verdict, numbers = rule(s)
        assert verdict == "untested", (rule, numbers)


def test_es_ahead_holds_and_rl_far_ahead_fails():
    es_ahead = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": [0.6, 0.7, 0.65, 0.62]}})
    assert claim_budget(es_ahead)[0] == "held"
    rl_ahead = study({"es_full": {"a": [0.55, 0.56, 0.54, 0.55]}, "grpo": {"x": [0.9, 0.91, 0.89, 0.9]}})
    verdict, numbers = claim_budget(rl_ahead)
    assert verdict == "failed" and "p = 0.029" in numbers
    noisy = study({"es_full": {"a": [0.7, 0.71, 0.69, 0.7]}, "grpo": {"x": [0.5, 1.0, 0.6, 0.95]}})
    assert claim_budget(noisy)[0] == "not shown"


def test_seed_variance_and_sensitivity_compare_es_with_rl():
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8], "b": [0.78, 0.8, 0.79, 0.79]},
               "grpo": {"x": [0.9, 0.6, 0.95, 0.7], "y": FLAT}})
    assert claim_seeds(s)[0] == "held"
    assert claim_settings(s)[0] == "held"
    s = study({"es_full": {"a": [0.9, 0.8, 0.95, 0.85], "b": FLAT}, "grpo": {"x": [0.8, 0.81, 0.79, 0.8],
                                                                          "y": [0.8, 0.8, 0.81, 0.8]}})
    assert claim_seeds(s)[0] == "failed"
    assert claim_settings(s)[0] == "failed"


def test_hacking_counts_hacked_runs_then_reads_reward_against_kl():
    moved = {"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": [0.8, 0.82, 0.78, 0.8]}}
    assert claim_hacking(study(moved, hacked={"grpo": 2}))[0] == "held"
    assert claim_hacking(study(moved, hacked={"es_full": 1}))[0] == "failed"
    verdict, numbers = claim_hacking(study(moved, kl={"es_full": 0.001, "grpo": 0.05}))
    assert verdict == "held" and "dominates" in numbers
    assert claim_hacking(study(moved, kl={"es_full": 0.05, "grpo": 0.001}))[0] == "failed"


def test_the_block_names_every_method_the_base_row_the_numerics_and_the_wall_time(tmp_path):
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": FLAT}})
    for r in s.results["runs"]:
        r.update(runtime=["cpu bfloat16"], engines=["native"], shared_prefix="on" if r["method"] == "grpo" else None)
    for summary_ in s.results["base"].values():
        summary_.update(device="cpu", dtype="bfloat16", engine="native")
    text = headline.headline([s])
    assert "training cpu bfloat16; engine: native; RL updates with the shared prefix on" in text
    assert "| Base model | 50.0 | 0.500 |" in text
    assert "| ES (full-rank) | 80.0 ± 0.8 | 0.800 ± 0.008 * |" in text and "| GRPO | 50.0 ± 0.0 | 0.500 ± 0.000 |" in text
    assert "**2.0 h** of training" in text and "Toy-v0: ES (full-rank) beat the base model" in text
    assert text.count("\n1. **") == 1 and "4. **ES reward-hacks less" in text


def test_the_readme_block_is_rewritten_and_a_missing_study_is_a_clear_error(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{headline.START}\nold\n{headline.END}\nrest\n")
    out = tmp_path / "study"
    out.mkdir()
    s = study({"es_full": {"a": [0.8, 0.81, 0.79, 0.8]}, "grpo": {"x": FLAT}})
    (out / "results.json").write_text(json.dumps(s.results))
    headline.main([str(out), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text and "| GRPO |" in text
    with pytest.raises(SystemExit):
        headline.main([str(tmp_path / "nothing")])
    assert "no results.json" in capsys.readouterr().err
    (tmp_path / "plain.md").write_text("no markers")
    with pytest.raises(SystemExit):
        headline.main([str(out), "--readme", str(tmp_path / "plain.md")])
    assert "headline:start" in capsys.readouterr().err
