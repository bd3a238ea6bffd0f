"""benchmarks.study.task_selection: the table and results of a preset on a tiny model, resuming, the
what-if extraction of an unclosed final <answer> block, and one-line errors."""

import json

import pytest
import yaml

import llm_envs
from benchmarks.study import task_selection as ts

pytestmark = pytest.mark.usefixtures("one_thread")

ENTRIES = [
    {"task": "chain_sum", "args": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, "opening": "answer"},
    {"task": "leg_counting", "args": {"min_animals": 1, "max_animals": 1}, "name": "legs"},
]


def _argv(tmp_path, model_dir, *extra):
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"engine": "hf", "entries": ENTRIES, "pilot": {"limit": 1, "entries": ENTRIES[:1]}},
                                      sort_keys=False))
    return ["--config", str(preset), "--model", str(model_dir), "--out", str(tmp_path / "out"),
            "--eval-out", str(tmp_path / "evals"), "--cache", str(tmp_path / "cache"), "--limit", "2",
            "--samples", "2", "--max-new-tokens", "6", "--score-workers", "0", *extra]


def test_writes_the_table_and_results_and_a_rerun_skips_finished_entries(tiny_model_dir, tmp_path, monkeypatch, capsys):
    table = ts.main(_argv(tmp_path, tiny_model_dir))
    assert table == tmp_path / "out" / "table.md"
    text = table.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| task |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "task", "config", "opening", "greedy pass@1 %", "greedy mean reward", "pass@2 %", "sampled mean reward",
        "answer tag % (closed / open)", "cut at limit %", "signal"]
    main_table = text.split("## Extraction")[0]  # the what-if table below it has rows of its own
    rows = [line for line in main_table.splitlines() if line.startswith(("| chain_sum", "| leg_counting"))]
    assert len(rows) == 2 and "(not yet)" not in text
    assert "| answer |" in rows[0] and "| think |" in rows[1]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    records = list(results["records"].values())
    assert [r["name"] for r in records] == [ts.parse_entries(ENTRIES, "x")[0].name, "legs"]
    for r in records:
        assert r["greedy"]["responses"] == 2 and r["sampled"]["responses"] == 4
        assert set(r["greedy"]) >= {"pass@1", "reward_mean", "answer_closed", "answer_open_stop", "cut", "extraction"}
        assert set(r["sampled"]) >= {"pass@2", "reward_mean"} and "closed_only" in r["sampled"]["extraction"]
        assert r["settings"]["limit"] == 2 and r["settings"]["engine"] == "hf"
    assert records[0]["opening_text"] == "<answer>"
    assert len(list((tmp_path / "evals").glob("*/*.summary.json"))) == 4  # the harness's files, per entry
    assert len(results["invocations"]) == 1

    def boom(*args, **kwargs):
        raise AssertionError("a finished entry was measured again")

    monkeypatch.setattr("eval.harness.generate_and_score", boom)
    capsys.readouterr()
    ts.main(_argv(tmp_path, tiny_model_dir))
    assert capsys.readouterr().err.count("skipped") == 2
    assert table.read_text().split("## Extraction")[0].count("| chain_sum") == 1

    # --rescore measures them again from the cached generations: nothing is generated
    monkeypatch.undo()
    monkeypatch.setattr("trainers.engines.hf.HFEngine.generate", boom)
    ts.main(_argv(tmp_path, tiny_model_dir, "--rescore", "true"))
    assert len(json.loads((tmp_path / "out" / "results.json").read_text())["invocations"]) == 2

    # other settings are other measurements; the pilot writes its own table beside it
    monkeypatch.undo()
    ts.main(_argv(tmp_path, tiny_model_dir, "--pilot", "true", "--limit", "1"))
    assert "Pilot" in (tmp_path / "out" / "pilot.md").read_text()
    assert len(json.loads((tmp_path / "out" / "results.json").read_text())["records"]) == 3


def test_extraction_counts_open_answer_blocks_and_scores_the_closed_only_parser():
    assert ts.unclosed_answer("<answer>7") and ts.unclosed_answer("<answer>1</answer> then <answer>2")
    assert not ts.unclosed_answer("<answer>7</answer>") and not ts.unclosed_answer("7")
    env = llm_envs.make("rg/chain_sum-v0", min_terms=2, max_terms=2, min_digits=1, max_digits=1, opening="<answer>",
                        lenient_unclosed=True,  # the reading this measures (no longer the default)
                        train_size=0, test_size=4)
    examples = env.examples("test")
    cases = [(examples[0].answer, True),                                  # open at the stop token, right
             (examples[1].answer, False),                                 # open, cut at the limit, right
             ("12345", True),                                             # open, wrong
             (f"{examples[3].answer}</answer> no: <answer>12345", True)]  # a closed block: both parsers read it
    scorer = llm_envs.BatchScorer(env, 0)
    scores = scorer.score_batch([c for c, _ in cases], examples)
    rows = [{"opening": "<answer>", "completion": c, "finished": done, "correct": s.correct, "reward": s.reward}
            for (c, done), s in zip(cases, scores)]
    assert [r["correct"] for r in rows] == [True, True, False, True]  # the env reads open blocks, closed ones first
    out = ts.extraction(rows, examples, 1, scorer)
    assert (out["open_stop"], out["open_stop_correct"], out["open_cut"], out["open_cut_correct"]) == (3, 2, 1, 1)
    assert out["closed_only"]["correct"] == 1 and out["closed_only"]["pass@1"] == pytest.approx(1 / 4)
    shares = ts._shares([r | {"tokens": 1} for r in rows])
    assert (shares["answer_closed"], shares["answer_open_stop"], shares["answer_open_cut"]) == (0.0, 0.75, 0.25)


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--limit", "0"], "--limit: must be >= 1"),
    (["--only", "nope"], "--only: no entry named nope"),
])
def test_bad_flags_are_one_line_errors(argv, message, tmp_path, capsys):
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"entries": ENTRIES}))
    with pytest.raises(SystemExit) as exc:
        ts.main(["--config", str(preset), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_bad_entry_fails_before_anything_runs(tmp_path, capsys):
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"entries": [{"task": "chain_sum", "args": {"min_trems": 2}}]}))
    with pytest.raises(SystemExit):
        ts.main(["--config", str(preset), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "min_trems" in err
    assert not (tmp_path / "out").exists()
