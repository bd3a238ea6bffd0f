"""What every trainer shares (``trainers.config``): bad environment options as one line before any
run directory exists, the ``algorithm`` each run records, and flags on the command line
(abbreviations refused, ``--resume`` overridden only by flags really given)."""

import pytest

import eval.__main__ as eval_cli
from trainers import es, grpo, ppo

TRAINERS = {"es": es, "grpo": grpo, "ppo": ppo}
BAD_OPTIONS = [('{"reward": "x"}', "reward must be one of"),  # Sudoku-v0's ValueError
               ('{"no_such_option": 1}', "unexpected keyword argument")]  # a TypeError


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_bad_env_options_are_one_line_before_the_run_directory(trainer, options, message, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        TRAINERS[trainer].main(["--env", "Sudoku-v0", "--env-args", options, "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --env-args") and message in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
def test_bad_env_options_in_eval_are_one_line(options, message, tmp_path, capsys):
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exc:
        eval_cli.main(["--env", "Sudoku-v0", "--env-args", options, "--out", str(out), "--cache", "off"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --env-args") and message in err[0], err
    assert not out.exists()
