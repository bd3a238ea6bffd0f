"""What every trainer shares (``trainers.common.config``): bad environment options as one line before any
run directory exists, the ``algorithm`` each run records, and flags on the command line
(abbreviations refused, ``--resume`` overridden only by flags really given)."""

import pytest
import yaml

import eval.__main__ as eval_cli
from eval import infer_method, load_results, table
from trainers.es import train as es
from trainers.rl import grpo, ppo
from trainers.common.config import build_config, to_dict

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


# ----- the algorithm a run records ------------------------------------------------------------------


@pytest.mark.parametrize("argv, algorithm, label", [
    (["es"], "es", "ES"),
    (["grpo"], "grpo", "GRPO (8)"),
    (["grpo", "--loss", "dr_grpo"], "dr_grpo", "Dr.GRPO"),
    (["ppo"], "ppo", "PPO"),
])
def test_every_config_records_its_algorithm(argv, algorithm, label):
    cfg = TRAINERS[argv[0]].resolve(argv[1:])
    written = to_dict(cfg)
    assert written["algorithm"] == algorithm
    # whatever the run directory is called (a sweep's beta=..._lr=... included)
    assert infer_method(written, "beta=0.001_lr=1e-06") == label
    # read back (--config, --resume) it is not an option, and cannot override the trainer's
    assert build_config(type(cfg), {**written, "algorithm": "es" if algorithm != "es" else "ppo"}).algorithm == algorithm


def test_a_ppo_run_outside_a_ppo_directory_is_labelled_ppo(tmp_path, tiny_model_dir, one_thread):
    run = tmp_path / "run"  # not ppo-...
    ppo.main(["--env", "toy_envs:Letter-v0", "--model", str(tiny_model_dir), "--out", str(run), "--steps", "1",
              "--batch-size", "2", "--group-size", "2", "--eval-every", "0"])
    assert yaml.safe_load((run / "config.yaml").read_text())["algorithm"] == "ppo"
    records = load_results([str(run)])
    assert [r["method"] for r in records] == ["Original", "PPO"]
    [t1] = table.method_table(records)
    assert t1.header[1:] == ["Original", "PPO"]


def test_resuming_a_run_without_algorithm_in_its_config(tmp_path):
    old = to_dict(grpo.resolve(["--out", str(tmp_path)]))
    del old["algorithm"]  # written before runs recorded it
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    cfg = grpo.resolve(["--resume", str(tmp_path)])
    assert cfg.algorithm == "grpo" and to_dict(cfg)["algorithm"] == "grpo"


# ----- flags ----------------------------------------------------------------------------------------


def saved_run(tmp_path, trainer, *argv) -> str:
    """A run directory holding only the config.yaml of ``trainer`` with flags ``argv``."""
    cfg = TRAINERS[trainer].resolve([*argv, "--out", str(tmp_path)])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    return str(tmp_path)


def test_abbreviated_flags_are_refused_also_with_resume(tmp_path, capsys):
    run = saved_run(tmp_path, "es", "--iterations", "5", "--population", "4")
    for argv in (["--resume", run, "--iter", "20"], ["--iter", "20"]):
        with pytest.raises(SystemExit) as exc:
            es.resolve(argv)
        assert exc.value.code == 2 and "unrecognized arguments: --iter 20" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        grpo.resolve(["--resume", run, "--step", "3"])
    assert "unrecognized arguments: --step" in capsys.readouterr().err
    (tmp_path / "ppo").mkdir()
    ppo_run = saved_run(tmp_path / "ppo", "ppo", "--steps", "3")
    with pytest.raises(SystemExit):
        ppo.resolve(["--resume", ppo_run, "--step", "3"])
    assert "unrecognized arguments: --step" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # python -m eval: --sample is not --samples
        eval_cli.main(["--env", "Conciseness-v0", "--sample", "4"])
    assert "unrecognized arguments: --sample" in capsys.readouterr().err


def test_flags_given_with_resume_override_the_saved_config_and_only_they(tmp_path):
    run = saved_run(tmp_path, "es", "--iterations", "5", "--population", "4", "--sigma", "0.01")
    cfg = es.resolve(["--resume", run, "--iterations", "20"])
    assert (cfg.iterations, cfg.population, cfg.sigma, cfg.out, cfg.resume) == (20, 4, 0.01, run, run)
    cfg = es.resolve(["--resume", run, "--iterations=500", "--population", "30"])  # = form; values equal to defaults
    assert (cfg.iterations, cfg.population) == (500, 30)
    assert es.resolve(["--resume", run]).iterations == 5


def test_config_file_with_resume_is_refused(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    run = saved_run(tmp_path / "run", "grpo", "--steps", "3")
    with pytest.raises(SystemExit):
        grpo.resolve(["--resume", run, "--config", str(tmp_path / "run" / "config.yaml")])
    assert "--config: not with --resume" in capsys.readouterr().err
