"""benchmarks.study.evidence: a study keeps every evaluated completion beside its records, the counts docs
quote come from those files, and rescoring them with the env's current code gives the study's tables
(the README's studies included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.study import evidence, driver as study
from benchmarks.study.record import COMPLETIONS, read_completions
from conftest import readme_headline

TABLES = ("table1.md", "table2.md", "runs.md", "seed_variance.md")
ROOT = Path(__file__).resolve().parents[1]
#: The studies behind the README's results: the directories its headline command names.
HEADLINE = readme_headline()[1].studies


@pytest.fixture
def tiny_study(tmp_path, tiny_model_dir, one_thread):
    out = tmp_path / "study"
    study.main(["--env", "toy_envs:Letter-v0", "--seeds", "1", "--max-samples", "16", "--model", str(tiny_model_dir),
                "--out", str(out), "--methods", "es_full,grpo", "--population", "4", "--group-size", "4",
                "--batch-size", "2", "--sigmas", "0.01", "--betas", "0", "--lrs", "1e-3", "--kl-samples", "2"])
    return out


def test_completions_are_kept_counted_and_rescored_to_the_same_tables(tiny_study, tmp_path, capsys):
    results = json.loads((tiny_study / "results.json").read_text())
    files = sorted(tiny_study.rglob(COMPLETIONS))
    assert len(files) == 2 + len(results["runs"])  # the base model's two evaluations, one file per run
    for record in results["runs"]:
        rows = read_completions(evidence.run_dir(tiny_study, record) / COMPLETIONS)
        greedy = [r for r in rows if r["eval"] == "greedy"]
        assert len(greedy) == record["greedy"]["responses"] and len(rows) == len(greedy) + record["kl"]["responses"]
        assert sum(r["correct"] for r in greedy) == round(record["greedy"]["pass@1"] * record["greedy"]["n"])
        assert "token_ids" not in rows[0] and {"completion", "reward", "opening"} <= set(rows[0])
        assert all("kl" in r for r in rows if r["eval"] == "kl")
    capsys.readouterr()
    text = evidence.main([str(tiny_study)])
    assert "| Original | greedy | 4 |" in text and text.count("| ES (full-rank) sigma=0.01 seed=0 |") == 2
    counted = json.loads(evidence.main([str(tiny_study), "--json"]))
    assert len(counted) == 2 + 2 * len(results["runs"])

    again = tmp_path / "rescored"
    evidence.main([str(tiny_study), "--rescore", str(again)])
    for name in TABLES:
        assert (again / name).read_text() == (tiny_study / name).read_text(), name


def test_rescoring_uses_the_envs_current_code(tiny_study, tmp_path, monkeypatch):
    import llm_envs
    from llm_envs import Score

    # The class the registry builds (an earlier test may have registered toy_envs under another import)
    env_class = type(llm_envs.make("toy_envs:Letter-v0"))
    monkeypatch.setattr(env_class, "score_completion", lambda self, c, e: Score(0.0, False, {"share": 0.0}))
    evidence.main([str(tiny_study), "--rescore", str(tmp_path / "zero")])
    results = json.loads((tmp_path / "zero" / "results.json").read_text())
    assert all(r["greedy"]["reward_mean"] == 0.0 and r["greedy"]["pass@1"] == 0.0 for r in results["runs"])
    assert results["base"]["greedy"]["reward_mean"] == 0.0
    assert (tmp_path / "zero" / "table1.md").read_text() != (tiny_study / "table1.md").read_text()


def test_a_study_without_completions_is_a_clear_error(tiny_study, capsys):
    next(tiny_study.rglob(COMPLETIONS)).unlink()
    with pytest.raises(SystemExit):
        evidence.main([str(tiny_study)])
    assert "completions files are missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evidence.main([str(tiny_study), "--rescore", str(tiny_study)])


@pytest.mark.parametrize("name", HEADLINE)
def test_the_readmes_studies_rescore_from_their_completions_to_their_committed_numbers(name, tmp_path):
    """Every committed completion of the README's studies, scored again with the envs' current
    code, gives each study's tables and every number of its results.json: a scoring change that
    would move a published number fails here (the config may gain options added since)."""
    committed = ROOT / name
    out = evidence.rescore(committed, tmp_path / "rescored")
    for table in TABLES + (("learning_curve.md",) if (committed / "learning_curve.md").is_file() else ()):
        assert (out / table).read_text() == (committed / table).read_text(), table
    before, after = (json.loads((d / "results.json").read_text()) for d in (committed, out))
    assert {k: v for k, v in after.items() if k != "config"} == {k: v for k, v in before.items() if k != "config"}
    assert {k: after["config"][k] for k in before["config"]} == before["config"]
