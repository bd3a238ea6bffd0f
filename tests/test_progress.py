"""Progress from the first second and an honest projection: generation's bar and ``on_progress``
move with every decode step; ``RunClock`` extrapolates measured time to the whole run (and names
the options that shorten a long one); the trainers show their bars and print the projection."""

import pytest

from trainers import es, grpo

from trainers.common import progress
from trainers.common.progress import RunClock, duration, evaluations_left
from trainers.engines.generation import generate

PROMPTS = [[{"role": "user", "content": q}] for q in ["Hi", "What is the capital of France?", "Say 42."]]


def test_generation_reports_every_decode_step(tiny_model, tiny_tokenizer, capsys):
    calls = []
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


def test_the_clock_projects_once_from_generation_and_once_from_training():
    said = []
    clock = RunClock(said.append, "iteration", 100, 50, "N=5 x 10 prompts", "--fewer or a GPU", "cpu", 512,
                     eval_rows=10, evals_left=11)
    clock.generation(5, 100, 10.0)  # the first report: after the prompt pass, the pace is measured from here
    clock.generation(10, 100, 25.0)  # 15 s later: too early to tell
    clock.generation(20, 100, 55.0)  # 3 s per response: 300 s per iteration; 30000 + 11 x 10 x 3 s in all
    clock.generation(30, 100, 60.0)
    assert said == ["projected on this cpu (from 55 s of generation, 3.00 s per response of up to 512 tokens): "
                    "~2 min per iteration (N=5 x 10 prompts), ~4.3 h for 100 iterations and 11 held-out "
                    "evaluations of 10. To shorten it: --fewer or a GPU"]
    clock.trained(30.0, 0.5, "member")  # 60 s per iteration: 6000 + 330 s, under LONG: no advice
    clock.trained(90.0, 1.0, "member")
    assert said[1:] == ["projected on this cpu (from the first member, 30 s): ~60 s per iteration (N=5 x 10 "
                        "prompts), ~106 min for 100 iterations and 11 held-out evaluations of 10"]
    short = []
    RunClock(short.append, "step", 4, 8, "d", "a", "cpu", 6).generation(8, 8, 0.5)  # a call that ended
    assert short == ["projected on this cpu (from 0 s of generation, 0.06 s per response of up to 6 tokens): "
                     "~0 s per step (d), ~2 s for 4 steps"]


ES_ARGS = ["--env", "Conciseness-v0", "--iterations", "2", "--population", "4", "--sigma", "0.05", "--alpha", "0.02",
           "--max-new-tokens", "6", "--eval-every", "0", "--seed", "3"]


@pytest.mark.parametrize("noise_mode, unit", [("full", "member"), ("lowrank", "iteration")])
def test_es_shows_progress_and_its_projection(noise_mode, unit, tiny_model_dir, tmp_path, capsys, monkeypatch,
                                              one_thread):
    monkeypatch.setattr(progress, "LONG", 0.0)  # every run is "long": the advice is printed
    es.main([*ES_ARGS, "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), "--noise", noise_mode])
    out = capsys.readouterr()
    assert "held-out test (iteration 0)" in out.err
    assert ("iteration 1" if noise_mode == "full" else "4 members' rows") in out.err
    projections = [line for line in out.out.splitlines() if line.startswith("projected on this cpu")]
    assert len(projections) == 2, out.out
    assert "s of generation, " in projections[0] and f"(from the first {unit}, " in projections[1]
    assert all("per iteration (N=4 x 2 prompts)" in p and "for 2 iterations and 1 held-out evaluation of 8" in p
               for p in projections)
    lowrank = "--noise lowrank (the whole population in one batched generation), " * (noise_mode == "full")
    assert projections[1].endswith(f"To shorten it: {lowrank}--batch-size (prompts per iteration, now 2), "
                                   f"--max-new-tokens (now 6) or a GPU")


def test_rl_shows_progress_and_its_projection(tiny_model_dir, tmp_path, capsys, one_thread):
    grpo.main(["--env", "toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"),
               "--steps", "2", "--batch-size", "2", "--group-size", "4", "--eval-every", "0"])
    out = capsys.readouterr()
    assert "held-out test (step 0)" in out.err and "step 1: sampling" in out.err
    projections = [line for line in out.out.splitlines() if line.startswith("projected on this cpu")]
    assert len(projections) == 2 and "(from the first step, " in projections[1], out.out
    assert all("per step (2 prompts x 4 responses)" in p and "for 2 steps and 1 held-out evaluation of 4" in p
               for p in projections)
