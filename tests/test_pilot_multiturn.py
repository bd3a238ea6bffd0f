"""The second multi-turn pilot's commands (``benchmarks.study.pilot_multiturn``): every trainer
command is one its trainer accepts, every trained model is evaluated as its base was."""

from __future__ import annotations

from pathlib import Path

from benchmarks.study import pilot_multiturn as pilot
from trainers.es import train as es
from trainers.rl import grpo


def test_the_pilots_commands_are_ones_the_trainers_and_eval_accept(tmp_path):
    steps = pilot.commands(tmp_path, "smollm2-135m", smoke=False)
    assert len(steps) == 11  # 2 envs x (base, 2 x (train, eval)) and the calc env's sampled base
    trained = {}
    for done, cmd in steps:
        if cmd[1] in ("trainers.es", "trainers.grpo"):
            cfg = (es if cmd[1] == "trainers.es" else grpo).resolve(cmd[2:])
            assert cfg.max_samples == 512 and cfg.seed == 0
            assert cfg.env in ("GuessNumber-v0", "Countdown-calc-v0") and Path(cfg.out) / "final" == done
            trained[cfg.out] = cfg
    assert {c.algorithm for c in trained.values()} == {"es", "dr_grpo"} and len(trained) == 4
    assert all(c.noise == "lowrank" for c in trained.values() if c.algorithm == "es")
    evals = [cmd for _, cmd in steps if cmd[1] == "eval"]
    bases = {cmd[cmd.index("--env") + 1]: cmd for cmd in evals if "--env" in cmd and "--samples" not in cmd}
    for cmd in evals:
        if "--env" not in cmd:  # a trained run, measured on its own env and options as its base was
            run = trained[cmd[cmd.index("--model") + 1]]
            base = bases[run.env]
            assert cmd[cmd.index("--limit") + 1] == base[base.index("--limit") + 1] == "100"
            assert cmd[cmd.index("--max-new-tokens") + 1] == base[base.index("--max-new-tokens") + 1]
            assert run.env_args == base[base.index("--env-args") + 1]


def test_the_dry_run_prints_every_command_and_runs_none(tmp_path, capsys):
    assert pilot.main(["--out", str(tmp_path / "p"), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12 and lines[-1].startswith("python -m eval.table --table episodes")
    assert not (tmp_path / "p").exists()
