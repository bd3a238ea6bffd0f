"""Progress from the first second and an honest projection: generation's bar and ``on_progress``
move with every decode step; ``RunClock`` extrapolates measured time to the whole run (and names
the options that shorten a long one); the trainers show their bars and print the projection."""

import json
import re
import time

import pytest

from trainers.es import train as es
from trainers.rl import grpo
from trainers.common import progress as bars
from trainers.engines.hf import HFEngine
from trainers.rl import loop

from trainers.common import progress
from trainers.common.progress import RunClock, duration, evaluations_left
from trainers.engines.generation import generate

PROMPTS = [[{"role": "user", "content": q}] for q in ["Hi", "What is the capital of France?", "Say 42."]]


def test_generation_reports_every_decode_step(tiny_model, tiny_tokenizer, capsys, monkeypatch):
    calls = []
    monkeypatch.setenv("LLM_ENVS_PROGRESS", "bars")  # as in a terminal
    generate(tiny_model, tiny_tokenizer, PROMPTS, max_new_tokens=4, batch_size=2, stop_ids=[], progress="answers",
             on_progress=lambda done, total, seconds: calls.append((done, total)))
    # a batch's rows count a quarter each per step of 4; whole at the batch's end
    assert calls == [(0.5, 3), (1.0, 3), (1.5, 3), (2.0, 3), (2.0, 3), (2.25, 3), (2.5, 3), (2.75, 3), (3.0, 3),
                     (3.0, 3)]
    assert "answers:   0%|" in capsys.readouterr().err  # the bar, named, from the start (redrawn every 0.1 s)


def test_durations_and_evaluations_left():
    assert [duration(s) for s in (40, 600, 3 * 3600, 5 * 86400, 3 * 365 * 86400)] == [
        "40 s", "10 min", "3.0 h", "5.0 days", "3.0 years"]
    assert evaluations_left(0, 25, 10) == 3  # at 10, 20 and the end
    assert evaluations_left(0, 20, 10) == 2 and evaluations_left(0, 5, 0) == 1 and evaluations_left(5, 5, 10) == 0


def test_the_clock_says_the_evaluation_then_projects_from_training():
    said = []
    clock = RunClock(said.append, "iteration", 100, 50, "N=5 x 10 prompts", "--fewer or a GPU", "cpu", 512,
                     eval_rows=10, evals_left=11)
    clock.evaluation(2, 10, 4.0)  # the first report, after the prompt pass
    clock.evaluation(4, 10, 14.0)  # 10 s later: too early to tell
    clock.evaluation(8, 10, 34.0)  # 34 s for 8 rows (the prompt pass included): 42.5 s per evaluation of 10
    clock.evaluation(10, 10, 40.0)
    assert said == ["held-out evaluation on this cpu (from 34 s of it): ~42 s per evaluation of 10, ~8 min for the "
                    "11 still to come; the time per iteration follows from its first training work"]
    clock.generation(5, 100, 10.0)  # a training call's first report
    clock.generation(20, 100, 55.0)  # 2.75 s per response: 137.5 s per iteration; 13750 + 468 s in all
    clock.generation(30, 100, 60.0)
    assert said[1:] == ["projected on this cpu (from 55 s of generation, 2.75 s per response of up to 512 tokens): "
                        "~2 min per iteration (N=5 x 10 prompts), ~3.9 h for 100 iterations and 11 held-out "
                        "evaluations of 10. To shorten it: --fewer or a GPU"]
    clock.trained(30.0, 0.5, "member")  # 60 s per iteration: 6000 + 468 s, under LONG: no advice
    clock.trained(90.0, 1.0, "member")
    assert said[2:] == ["projected on this cpu (from the first member, 30 s): ~60 s per iteration (N=5 x 10 "
                        "prompts), ~108 min for 100 iterations and 11 held-out evaluations of 10"]


def test_a_short_first_call_is_not_extrapolated():
    """Under SETTLE seconds a call's fixed costs (noise work, the prompt pass) are too large a share
    of it: nothing is said until the first unit of training is whole."""
    said = []
    clock = RunClock(said.append, "step", 4, 8, "d", "a", "cpu", 6)
    clock.generation(8, 8, 0.5)  # a call that ended, 0.5 s
    clock.generation(8, 8, 30.0)  # a later call says nothing either: the first call is the measure
    assert said == []
    clock.trained(2.0, 1.0, "step")
    assert said == ["projected on this cpu (from the first step, 2 s): ~2 s per step (d), ~8 s for 4 steps"]


def test_an_evaluation_that_ends_soon_after_its_first_report_is_timed_whole():
    """A first report late in the call (here at 26 s, 70 of 100 rows already counted: rows that
    finish early count whole) and the end at 29 s: the evaluation took 29 s, not the 8 s that the
    pace since that first report (3 s for 30 rows) gave on the default model's first rg/ run."""
    said = []
    clock = RunClock(said.append, "iteration", 8, 128, "d", "a", "cpu", 64, eval_rows=100, evals_left=2)
    clock.evaluation(70, 100, 26.0)
    clock.evaluation(100, 100, 29.0)
    assert said == ["held-out evaluation on this cpu (from 29 s of it): ~29 s per evaluation of 100, ~58 s for the "
                    "2 still to come; the time per iteration follows from its first training work"]


def test_a_unit_that_does_more_than_generate_is_not_projected_from_its_sampling():
    """An RL step's update comes after its sampling (on CPU, SmolLM2, 8 x 8 responses: 25 s of
    sampling, then a 121 s step): the sampling's pace says only what it measures, and the run's
    projection waits for the first step, whole."""
    said = []
    clock = RunClock(said.append, "step", 16, 64, "8 prompts x 8 responses", "a", "cpu", 64,
                     also="the update (log-probs, backward pass, optimizer step)")
    clock.generation(4, 64, 2.0)
    clock.generation(64, 64, 25.0)
    assert said == ["sampling on this cpu (from 25 s of generation, 0.39 s per response of up to 64 tokens): ~25 s per "
                    "step for its 64 responses alone; the update (log-probs, backward pass, optimizer step) comes on "
                    "top, not measured yet: the run's time follows its first step"]
    clock.trained(121.0, 1.0, "step")
    assert said[1] == "projected on this cpu (from the first step, 121 s): ~2 min per step (8 prompts x 8 responses), ~32 min for 16 steps"


def vllm_reports(rows: int, finish: list[float]):
    """What vLLM's progress tells: nothing until a request finishes, then the count of finished
    requests at each finish (``finish``: when each one does)."""
    return [(k + 1, rows, t) for k, t in enumerate(sorted(finish))]


@pytest.mark.parametrize("finish", [[25.0] * 64, [1.0] + [30.0] * 63], ids=["together", "one early finisher"])
def test_an_engine_reporting_only_finished_rows_is_projected_from_whole_calls(finish):
    """64 rows of one call, each counted when it finishes, as vLLM does: finishing together or one
    early, the pace is the call's seconds over its rows (0.39 and 0.47 s), not the 0.00 s or 23 s
    per response that extrapolating from the first finished row gave."""
    said = []
    clock = RunClock(said.append, "iteration", 10, 64, "N=32 x 2 prompts", "a", "cpu", 48, whole_calls=True)
    for done, total, seconds in vllm_reports(64, finish):
        clock.generation(done, total, seconds)
    per_row = max(finish) / 64
    assert said == [f"projected on this cpu (from {max(finish):.0f} s of generation, {per_row:.2f} s per response "
                    f"of up to 48 tokens): ~{max(finish):.0f} s per iteration (N=32 x 2 prompts), "
                    f"~{10 * max(finish) / 60:.0f} min for 10 iterations"]


ES_ARGS = ["--env", "Conciseness-v0", "--iterations", "2", "--population", "4", "--sigma", "0.05", "--alpha", "0.02",
           "--max-new-tokens", "6", "--eval-every", "0", "--seed", "3"]


def projections(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("projected on this cpu")]


@pytest.mark.parametrize("noise_mode, unit", [("full", "member"), ("lowrank", "iteration")])
def test_es_shows_progress_and_its_projection(noise_mode, unit, tiny_model_dir, tmp_path, capsys, monkeypatch,
                                              one_thread):
    monkeypatch.setattr(progress, "LONG", 0.0)  # every run is "long": the advice is printed
    monkeypatch.setenv("LLM_ENVS_PROGRESS", "bars")  # as in a terminal
    es.main([*ES_ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), "--noise", noise_mode])
    out = capsys.readouterr()
    assert "held-out test (iteration 0)" in out.err and "\r" in out.err
    assert ("iteration 1" if noise_mode == "full" else "4 members' rows") in out.err
    assert "held-out evaluation on this cpu (from " in out.out and "per evaluation of 8, " in out.out
    [projection] = projections(out.out)  # the calls are far shorter than SETTLE: the first unit speaks
    assert f"(from the first {unit}, " in projection
    assert "per iteration (N=4 x 2 prompts)" in projection and "for 2 iterations and 1 held-out evaluation of 8" in projection
    lowrank = "--noise lowrank (the whole population in one batched generation), " * (noise_mode == "full")
    assert projection.endswith(f"To shorten it: {lowrank}--batch-size (prompts per iteration, now 2), "
                               f"--max-new-tokens (now 6) or a GPU")


def test_rl_shows_progress_and_its_projection(tiny_model_dir, tmp_path, capsys, one_thread, monkeypatch):
    monkeypatch.setenv("LLM_ENVS_PROGRESS", "bars")
    grpo.main(["--env", "toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"),
               "--steps", "2", "--batch-size", "2", "--group-size", "4", "--eval-every", "0"])
    out = capsys.readouterr()
    assert "held-out test (step 0)" in out.err and "step 1: sampling" in out.err
    [projection] = projections(out.out)
    assert "(from the first step, " in projection and "per step (2 prompts x 4 responses)" in projection
    assert "for 2 steps and 1 held-out evaluation of 4" in projection


class SlowFinishedRowsEngine(HFEngine):
    """The HF engine, slowed to ``PER_ROW`` s per row and reporting as vLLM does: a row counts only
    when it finishes, and the rows finish at the end of the call."""

    finished_rows_only = True
    PER_ROW = 0.12

    def generate(self, prompts, *args, on_progress=None, progress=False, **kwargs):
        start = time.perf_counter()
        out = super().generate(prompts, *args, **kwargs)
        time.sleep(self.PER_ROW * len(out.texts))
        if on_progress is not None:
            for k in range(len(out.texts)):
                on_progress(k + 1, len(out.texts), time.perf_counter() - start)
        return out


@pytest.mark.parametrize("trainer", ["es-full", "es-lowrank", "grpo"])
def test_projections_are_within_2x_of_the_time_a_unit_takes(trainer, tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                            one_thread):
    """With an engine that reports finished rows only, every projection printed is within 2x of
    the seconds per iteration (step) the run then logs."""
    monkeypatch.setattr(progress, "SETTLE", 0.5)  # the slowed calls are ~1 s: long enough to extrapolate
    module = loop if trainer == "grpo" else es
    monkeypatch.setattr(module, "make_engine", lambda options, model, tokenizer, *a, **kw: SlowFinishedRowsEngine(model, tokenizer))
    run = tmp_path / "run"
    if trainer == "grpo":
        grpo.main(["--env", "toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(run), "--steps", "3",
                   "--batch-size", "2", "--group-size", "4", "--eval-every", "0"])
    else:
        es.main([*ES_ARGS, "--iterations", "3", "--model", str(tiny_model_dir), "--out", str(run),
                 "--noise", trainer.removeprefix("es-")])
    said = projections(capsys.readouterr().out)
    assert said
    unit = "step" if trainer == "grpo" else "iteration"
    measured = [r["seconds"] for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "seconds" in r]
    for line in said:
        seconds = float(re.search(rf"~(\d+) s per {unit}", line).group(1))
        assert 0.5 * min(measured) <= seconds <= 2 * max(measured), (line, measured)


def test_logs_get_plain_lines_at_a_readable_rate(tiny_model_dir, tmp_path, capsys, monkeypatch, one_thread):
    """stderr to a file: no carriage returns or escape codes, a line per iteration, and inside a long
    iteration no more than one line every LINE_EVERY seconds (none here: every phase is short)."""
    monkeypatch.setenv("LLM_ENVS_PROGRESS", "lines")
    es.main([*ES_ARGS, "--iterations", "3", "--model", str(tiny_model_dir), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert [line.split(" [")[0] for line in lines if line.startswith("ES: ")] == [
        "ES: 0/3 iteration (0%)", "ES: 1/3 iteration (33%)", "ES: 2/3 iteration (67%)", "ES: 3/3 iteration (100%)"]
    assert len(lines) <= 4 + 2, lines  # the iterations, and at most the first line of one transient bar


def test_line_bars_write_at_most_one_line_per_interval(monkeypatch, capsys):
    monkeypatch.setenv("LLM_ENVS_PROGRESS", "lines")
    now = [1000.0]
    monkeypatch.setattr(bars.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(bars.LineBar, "_last_line", float("-inf"))
    rows = bars.bar(total=100, desc="rows", unit="seq")
    for _ in range(100):  # 100 updates over 99 s: a line at the start, then one every 30 s
        rows.update(1)
        now[0] += 1.0
    rows.close()
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 4 and all(line.startswith("rows: ") for line in err.splitlines())
