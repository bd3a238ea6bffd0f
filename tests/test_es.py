"""The ES trainer end to end on a tiny random model, in both noise modes: CLI errors, learning on a
toy env (and not learning with the update's sign flipped), resume after a kill, replay, and rank 0's
slow save on two processes (``test_distributed_es.py`` has the rest of several processes: the same
numbers as one, the weight check, a killed rank, resume on another process count)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainers.es import train as es
from trainers.common import held_out
from trainers.es.replay import rebuild

ROOT = Path(__file__).resolve().parents[1]


def run_args(model_dir, out, *extra):
    # sigma is large because a tiny random model's greedy text must change under perturbation
    return ["--env", "Conciseness-v0", "--model", str(model_dir), "--out", str(out), "--iterations", "4",
            "--population", "4", "--sigma", "0.05", "--alpha", "0.02", "--max-new-tokens", "6",
            "--eval-every", "2", "--checkpoint-every", "2", "--seed", "3", *extra]


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(run_dir) / "final" / "model.safetensors"))


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("argv, message", [
    (["--env", "Nope-v0"], "unknown env id 'Nope-v0'"),
    (["--sigma", "-1"], "--sigma: must be a positive number"),
    (["--sigma", "abc"], "--sigma: expected float"),
    (["--population", "1"], "--population: must be >= 2"),
    (["--population", "5", "--mirrored", "true"], "must be even with --mirrored"),
    (["--param-filter", "("], "--param-filter: invalid regex"),
    (["--env-args", "[1]"], "--env-args: must be a JSON object"),
    (["--config", "/nonexistent.yaml"], "--config: no such file"),
    (["--resume", "/nonexistent-run"], "--resume /nonexistent-run: no run there"),
    (["--env", "Conciseness-v0", "--model", "/no/such/model", "--iterations", "0"], "/no/such/model"),
    (["--noise", "lowrank", "--rank", "0"], "--rank: must be >= 1"),
    (["--noise", "gaussian"], "--noise: invalid choice: 'gaussian'"),
    (["--noise", "lowrank", "--shared-noise", "true"], "--shared-noise: applies to --noise full only"),
])
def test_cli_errors_are_one_clear_line(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        es.main([*argv, "--out", str(tmp_path / "run")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--rank", "33"], "--rank 33 exceeds what layer model.layers.0.self_attn.k_proj.weight allows"),
    (["--param-filter", "norm"], "--param-filter 'norm' matches no linear layer"),
])
def test_lowrank_errors_that_need_the_model(extra, message, tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        es.main([*run_args(tiny_model_dir, tmp_path / "run"), "--noise", "lowrank", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def learning_run(model_dir, out, noise_mode, mirrored):
    es.main(["--env", "toy_envs:Letter-v0", "--model", str(model_dir), "--out", str(out), "--iterations", "10",
             "--population", "16", "--sigma", "0.02", "--alpha", "0.05", "--eval-every", "0", "--seed", "0",
             "--noise", noise_mode, "--rank", "2", "--mirrored", str(mirrored)])
    rewards = [json.loads(line).get("reward_mean") for line in (out / "log.jsonl").read_text().splitlines()]
    rewards = [r for r in rewards if r is not None]
    return sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3


@pytest.mark.parametrize("mirrored", [False, True])
@pytest.mark.parametrize("noise_mode", ["full", "lowrank"])
def test_es_raises_the_reward_on_a_toy_env(noise_mode, mirrored, tiny_model_dir, tmp_path, one_thread):
    """Letter-v0 (reward: the share of "a" in the completion) on the tiny random model."""
    first, last = learning_run(tiny_model_dir, tmp_path / "run", noise_mode, mirrored)
    assert last > first + 0.1, (first, last)


@pytest.mark.parametrize("noise_mode", ["full", "lowrank"])
def test_a_sign_error_would_fail(noise_mode, tiny_model_dir, tmp_path, one_thread, monkeypatch):
    """The same run with the update's sign flipped does not learn: the test above can catch it."""
    real = es.update_coefficients
    monkeypatch.setattr(es, "update_coefficients", lambda *a: (real(*a)[0], [-c for c in real(*a)[1]]))
    first, last = learning_run(tiny_model_dir, tmp_path / "run", noise_mode, True)
    assert last < first + 0.05, (first, last)


def test_config_file_and_unknown_key(tmp_path, capsys):
    good = tmp_path / "ok.yaml"
    good.write_text("env: Sudoku-v0\nsigma: 0.002\nmax-new-tokens: 64\n")
    cfg = es.resolve(["--config", str(good), "--population", "8"])
    assert (cfg.env, cfg.sigma, cfg.max_new_tokens, cfg.population, cfg.alpha) == ("Sudoku-v0", 0.002, 64, 8, 5e-4)
    bad = tmp_path / "bad.yaml"
    bad.write_text("sigmaa: 0.1\n")
    with pytest.raises(SystemExit):
        es.main(["--config", str(bad)])
    assert "unknown option(s) --sigmaa" in capsys.readouterr().err


def test_paper_defaults_per_env():
    assert (es.resolve(["--env", "ARC-AGI-v0"]).population, es.resolve(["--env", "ARC-AGI-v0"]).alpha) == (50, 3e-4)
    assert es.resolve(["--env", "Sudoku-v0"]).population == 32


NOISE = {"full": [], "lowrank": ["--noise", "lowrank", "--rank", "2", "--mirrored", "true"],
         "full-bf16": ["--dtype", "bf16"], "lowrank-bf16": ["--noise", "lowrank", "--dtype", "bf16"],
         "full-sampled": ["--temperature", "1", "--samples-per-prompt", "2"],
         "lowrank-sampled": ["--noise", "lowrank", "--mirrored", "true", "--temperature", "1", "--samples-per-prompt", "2"]}


@pytest.mark.parametrize("noise_mode", ["full", "lowrank", "full-bf16", "lowrank-bf16", "full-sampled",
                                        "lowrank-sampled"])
def test_run_resume_after_kill_and_replay(noise_mode, tmp_path, tiny_model_dir, kill_on_call):
    full = tmp_path / "full"
    es.main(run_args(tiny_model_dir, full, *NOISE[noise_mode]))
    log = [json.loads(line) for line in (full / "log.jsonl").read_text().splitlines()]
    train = [r for r in log if "reward_mean" in r]
    assert [r["iteration"] for r in train] == [1, 2, 3, 4]
    assert any(not r["skipped"] for r in train), "rewards never differed: the test would prove nothing"
    assert {r["iteration"] for r in log if "eval_reward" in r} == {0, 2, 4}
    assert (full / "tb").is_dir() and (full / "checkpoints" / "000004").is_dir()

    # Kill in the middle of iteration 3 (full: the second member's rollout; lowrank: the
    # population's one batched rollout), then resume.
    killed = tmp_path / "killed"
    with kill_on_call(es, "rollout", 2 * 4 + 2 if noise_mode.startswith("full") else 3):
        es.main(run_args(tiny_model_dir, killed, *NOISE[noise_mode]))
    assert not (killed / "final").exists()
    with pytest.raises(SystemExit):  # the same --out without --resume would overwrite: refused
        es.main(run_args(tiny_model_dir, killed, *NOISE[noise_mode]))
    es.main(["--resume", str(killed)])
    assert_same_weights(final_weights(full), final_weights(killed))
    resumed = [json.loads(line) for line in (killed / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in resumed if "reward_mean" in r] == [1, 2, 3, 4]

    # The update log alone rebuilds the final model from the base.
    model, _, last = rebuild(full)
    assert last == 4
    assert_same_weights(final_weights(full), {k: v for k, v in model.state_dict().items() if k in final_weights(full)})


@pytest.mark.parametrize("noise_mode", ["full", "lowrank"])
def test_temperature_zero_is_the_greedy_run(noise_mode, tmp_path, tiny_model_dir, monkeypatch):
    """--temperature 0 (the default) is the paper's greedy loop, bit for bit: members generate with
    temperature 0 and no seed, and the explicit flags change nothing."""
    calls = []
    real = es.rollout
    monkeypatch.setattr(es, "rollout", lambda *a, **k: calls.append((a[5:7], k.get("perturbation") is not None))
                        or real(*a, **k))
    short = ["--iterations", "2", "--eval-every", "0", *NOISE[noise_mode]]
    es.main(run_args(tiny_model_dir, tmp_path / "default", *short))
    assert calls and all(args == (0.0, None) for args, member in calls if member)  # temperature, seeds
    es.main(run_args(tiny_model_dir, tmp_path / "zero", *short, "--temperature", "0", "--top-p", "0.5",
                     "--samples-per-prompt", "1"))
    assert (tmp_path / "default" / "updates.jsonl").read_text() == (tmp_path / "zero" / "updates.jsonl").read_text()
    assert_same_weights(final_weights(tmp_path / "default"), final_weights(tmp_path / "zero"))


def test_sampled_members_share_their_sample_seeds(tmp_path, tiny_model_dir, monkeypatch):
    """Every member of an iteration (mirrored pairs included) is measured on the same sample seeds,
    K per prompt; the next iteration draws new ones."""
    seen = []
    real = es.rollout
    monkeypatch.setattr(es, "rollout", lambda *a, **k: seen.append((a[7] if len(a) > 7 else None, tuple(a[6] or ())))
                        or real(*a, **k))
    es.main(run_args(tiny_model_dir, tmp_path / "run", "--iterations", "2", "--eval-every", "0", "--mirrored", "true",
                     "--temperature", "1", "--samples-per-prompt", "3"))
    members = [(k, seeds) for k, seeds in seen if seeds]
    assert len(members) == 8 and all(k == 3 for k, _ in members)  # 4 members x 2 iterations, 3 samples per prompt
    first, second = {s for _, s in members[:4]}, {s for _, s in members[4:]}
    assert len(first) == len(second) == 1 and first != second
    assert len(next(iter(first))) == 2 * 3  # Conciseness-v0's 2 training prompts x 3 samples
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in log if "samples" in r] == [24, 48]  # N=4 x 2 prompts x 3 samples per iteration


def test_samples_per_prompt_needs_a_temperature(capsys, tmp_path):
    with pytest.raises(SystemExit):
        es.main(["--env", "Conciseness-v0", "--samples-per-prompt", "4", "--out", str(tmp_path / "run")])
    assert "--samples-per-prompt: needs --temperature > 0" in capsys.readouterr().err


def test_the_noise_device_file_appears_whole_to_the_other_ranks(tmp_path, monkeypatch):
    """The main rank writes it while the others check it, so a reader sees no file or the whole
    file, never an empty one (a two-process study once failed reading it empty)."""
    from trainers.common import files
    from trainers.common.config import ConfigError
    from trainers.es.update_log import check_noise_device

    replace, seen = os.replace, []

    def publish(src, dst):  # another rank checks while the file is being written
        check_noise_device(tmp_path, torch.device("cpu"))
        seen.append(Path(dst).exists())
        replace(src, dst)

    monkeypatch.setattr(files.os, "replace", publish)
    check_noise_device(tmp_path, torch.device("cpu"), write=True)
    assert seen == [False]
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="generated its noise on cpu"):
        check_noise_device(tmp_path, torch.device("cuda"))


def test_replay_and_resume_refuse_another_noise_device(tmp_path, tiny_model_dir, capsys):
    """CPU and CUDA generators differ: a run whose noise came from CUDA is not rebuilt on the CPU."""
    from trainers.es import replay

    run = tmp_path / "run"
    es.main(run_args(tiny_model_dir, run, "--iterations", "1", "--eval-every", "0"))
    assert json.loads((run / "noise_device.json").read_text()) == {"device": "cpu"}
    (run / "noise_device.json").write_text('{"device": "cuda"}')  # as if it had run on a GPU
    capsys.readouterr()
    for call in (lambda: replay.main([str(run), "--out", str(tmp_path / "rebuilt"), "--device", "cpu"]),
                 lambda: es.main(["--resume", str(run), "--iterations", "2"])):
        with pytest.raises(SystemExit) as exc:
            call()
        assert exc.value.code == 2
        assert "generated its noise on cuda" in capsys.readouterr().err
    assert not (tmp_path / "rebuilt").exists()


SLOW_SAVE = """
import os, time
if os.environ.get("RANK") == "0":  # rank 0 takes 20 s to save, far beyond the collectives' timeout
    import trainers.common.run_dir as run_dir
    real = run_dir.RunDir.save_checkpoint
    saves = []

    def slow(self, *args, **kwargs):
        if not saves:  # the first save only: the next iteration's all-reduce is what it would time out
            time.sleep(20)
        saves.append(1)
        return real(self, *args, **kwargs)

    run_dir.RunDir.save_checkpoint = slow
"""


def test_a_slow_save_on_rank_0_times_out_no_collective(tmp_path, tiny_model_dir):
    """The other ranks wait for rank 0's checkpoint at a barrier with a long timeout, not inside
    the next iteration's all-reduce (whose timeout is 10 s here)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_SAVE)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{hooks}", "OMP_NUM_THREADS": "1",
           "LLM_ENVS_DIST_TIMEOUT": "10"}
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]  # (accelerate's --cpu starts one process)
    run = tmp_path / "run"
    cmd = [sys.executable, *launch, "-m", "trainers.es", *run_args(tiny_model_dir, run), "--iterations", "2",
           "--checkpoint-every", "1", "--eval-every", "0", *NOISE["lowrank"]]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "final").is_dir() and (run / "checkpoints" / "000002").is_dir()


def test_shipped_configs_parse():
    configs = sorted((ROOT / "benchmarks" / "configs").glob("es_*.yaml"))
    assert configs
    for path in configs:
        cfg = es.resolve(["--config", str(path)])
        assert cfg.population >= 2 and cfg.sigma > 0 and cfg.alpha > 0, path


@pytest.mark.parametrize("noise_mode", ["full", "lowrank"])
def test_max_samples_is_never_exceeded(noise_mode, tmp_path, tiny_model_dir, capsys):
    # 4 members x 2 prompts = 8 responses per iteration: a budget of 23 allows 2 iterations, not 3
    run = tmp_path / "budget"
    es.main(run_args(tiny_model_dir, run, "--max-samples", "23", "--eval-every", "0", *NOISE[noise_mode]))
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    train = [r for r in log if "reward_mean" in r]
    assert [r["samples"] for r in train] == [8, 16]
    assert train[1]["tokens"] == train[0]["tokens"] + train[1]["tokens_iteration"]
    assert [r["iteration"] for r in log if "eval_reward" in r] == [0, 2]
    assert (run / "final").is_dir()
    # a budget of exactly 3 iterations runs them all
    es.main(run_args(tiny_model_dir, tmp_path / "exact", "--max-samples", "24", "--eval-every", "0", *NOISE[noise_mode]))
    log = [json.loads(line) for line in (tmp_path / "exact" / "log.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in log if "reward_mean" in r] == [8, 16, 24]
    # less than one iteration: a one-line error, no run
    capsys.readouterr()
    with pytest.raises(SystemExit):
        es.main(run_args(tiny_model_dir, tmp_path / "none", "--max-samples", "7", *NOISE[noise_mode]))
    assert "--max-samples 7 is less than one iteration: N=4 x 2 prompts = 8 responses" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("noise_mode", ["full", "lowrank"])
def test_a_kill_during_the_final_evaluation_is_evaluated_on_resume(noise_mode, tmp_path, tiny_model_dir, kill_on_call):
    """Killed while measuring the final model (all iterations done and logged): the resumed run
    measures it, so the log's last held-out record is the final model's, not the base model's."""
    run = tmp_path / "run"
    with kill_on_call(held_out, "evaluate", 2):  # 1: iteration 0, 2: the final model
        es.main(run_args(tiny_model_dir, run, "--iterations", "2", "--eval-every", "0", *NOISE[noise_mode]))
    es.main(["--resume", str(run)])
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in log if "eval_reward" in r] == [0, 2]
    assert (run / "final").is_dir()
