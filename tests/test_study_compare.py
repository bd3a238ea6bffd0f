"""benchmarks.study.compare: two studies' shared runs, matched across float rounding, with their
scores and identical completions counted; a run only one study holds is left out."""

import gzip
import json

import pytest

from benchmarks.study.compare import compare, main
from benchmarks.study.config import LABELS
from benchmarks.study.plan import setting_name

MACHINE_A = {"cpu": "AMD EPYC", "cpu_bf16_units": "none", "threads": 2}
MACHINE_B = {"cpu": "AMD EPYC", "cpu_bf16_units": "avx512_bf16", "threads": 2}


def write_run(study, method, hparams, seed, machine, test, val, greedy, sampled):
    """A finished run as the study commits it: its record and its test completions."""
    setting = setting_name(method, hparams)  # the study's own directory name
    path = study / "runs" / method / setting / f"seed={seed}"
    path.mkdir(parents=True)
    record = {"method": method, "label": LABELS[method], "setting": setting, "seed": seed,
              "hparams": hparams, "machines": [machine],
              "validation": {"eval_pass@1": val}, "greedy": {"pass@1": test}, "kl": {"kl_mean": 0.1}}
    (path / "study_record.json").write_text(json.dumps(record))
    rows = [{"eval": kind, "id": i, "sample": 0, "completion": text}
            for kind, texts in (("greedy", greedy), ("kl", sampled)) for i, text in enumerate(texts)]
    with gzip.open(path / "completions.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_shared_runs_are_matched_and_their_differences_counted(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    # the same run, with the grid extension's rounding in one study's alpha
    write_run(a, "es_full", {"sigma": 1e-3, "alpha": 0.0405}, 0, MACHINE_A, 0.5, 0.25, ["x", "y"], ["p", "q"])
    write_run(b, "es_full", {"sigma": 1e-3, "alpha": 0.040500000000000015}, 0, MACHINE_B, 0.5, 0.25, ["x", "y"],
              ["p", "r"])
    # an RL run whose greedy answers changed
    rl = {"beta": 0.0, "lr": 1e-5}
    write_run(a, "grpo", rl, 0, MACHINE_A, 0.5, 0.5, ["x", "y"], ["p", "q"])
    write_run(b, "grpo", rl, 0, MACHINE_B, 1.0, 0.75, ["x", "z"], ["s", "t"])
    write_run(a, "grpo", rl, 1, MACHINE_A, 0.5, 0.5, ["x"], ["p"])  # only in a: not compared

    text = compare(a, b)

    assert "2 runs in both" in text
    assert "- ES (full-rank): 1 of 1 run repeated" in text
    assert "- GRPO: 0 of 1 run repeated" in text
    es_row, grpo_row = [line for line in text.splitlines() if line.startswith("| ES (full-rank),") or line.startswith("| GRPO,")]
    assert "| 0.50 / 0.50 | 0.250 / 0.250 |" in es_row and "| 2 of 2 | 1 of 2 |" in es_row
    assert "CPU AMD EPYC (bf16 units: none) / CPU AMD EPYC (bf16 units: avx512_bf16)" in es_row
    assert "| **0.50 / 1.00** | **0.500 / 0.750** |" in grpo_row and "| 1 of 2 | 0 of 2 |" in grpo_row
    assert "seed 1" not in text


def test_bad_directories_and_records_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing"), str(tmp_path)])
    assert "missing: no such study directory" in capsys.readouterr().err
    broken = tmp_path / "a" / "runs" / "es" / "s" / "seed=0"
    broken.mkdir(parents=True)
    (broken / "study_record.json").write_text("{not json")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a"), str(tmp_path)])
    assert "not a readable run record" in capsys.readouterr().err
    (broken / "study_record.json").write_text(json.dumps({"method": "es", "seed": 0, "setting": "s", "hparams": {}}))
    (broken / "completions.jsonl.gz").write_bytes(b"not gzip")
    other = tmp_path / "b" / "runs" / "es" / "s" / "seed=0"
    other.mkdir(parents=True)
    (other / "study_record.json").write_text(json.dumps({"method": "es", "seed": 0, "setting": "s", "hparams": {}}))
    (other / "completions.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a"), str(tmp_path / "b")])
    assert "not a readable completions file" in capsys.readouterr().err
