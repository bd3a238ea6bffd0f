"""benchmarks.lent_gpu: what a lent GPU lacks is computed from our own dependencies, the default
tokenizer travels without its weights, and ``run`` keeps its parts inside one call's limit and
repeats what matters at the end of its output (a call returns only its last lines)."""

import ast
import importlib.metadata as metadata
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.gpu import lent as lent_gpu


def test_the_launcher_imports_with_the_standard_library_alone():
    """It runs on the lent machine before the wheels it installs: no site-packages (``-S``)."""
    code = f"import sys; sys.path.insert(0, {str(lent_gpu.ROOT)!r}); import benchmarks.lent_gpu"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_what_the_lent_image_lacks_is_our_dependencies_it_does_not_hold():
    wanted = lent_gpu.missing()
    assert {"gymnasium", "reasoning-gym", "math-verify", "gguf"} <= set(wanted)
    assert {"farama-notifications", "latex2sympy2-extended", "antlr4-python3-runtime", "pycosat"} <= set(wanted)
    assert not set(wanted) & lent_gpu.IMAGE and "torch" not in wanted and "llm-envs" not in wanted
    # followed down only until the image holds a package: reasoning-gym's own needs go with it
    without_rg = lent_gpu.missing(image=lent_gpu.IMAGE | {"reasoning-gym"})
    assert "pycosat" not in without_rg and "gymnasium" in without_rg


def our_imports() -> set[str]:
    """Top-level names of every module our own code imports, wherever the import sits."""
    names = set()
    for package in ("llm_envs", "trainers", "benchmarks", "eval"):
        for path in (Path(lent_gpu.ROOT) / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names


def test_every_package_our_code_imports_is_in_the_image_the_wheels_or_an_extra():
    """A package our code imports that is neither in the lent image nor a declared dependency would
    fail on the lent machine, minutes into its time. The extras (vLLM, TRL, datasets) are not sent:
    the GPU commands run without them (gpu_check names vLLM as not installed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extras = {canonicalize_name(Requirement(line).name) for line in metadata.requires("llm-envs")
              if "extra ==" in line}
    dists = metadata.packages_distributions()
    ours = {"llm_envs", "trainers", "benchmarks", "eval", "tests", "__future__"}
    used = {}
    for name in our_imports() - set(sys.stdlib_module_names) - ours:
        found = dists.get(name)
        assert found or canonicalize_name(name) in extras, f"{name}: imported by our code, from no package here"
        used[name] = {canonicalize_name(d) for d in found or [name]}
    assert {"torch", "transformers", "gymnasium", "reasoning-gym", "math-verify"} <= set().union(*used.values())
    travels = lent_gpu.IMAGE | set(lent_gpu.missing()) | extras
    assert {name: d for name, d in used.items() if not d & travels} == {}


def test_the_tokenizer_travels_without_weights_and_loads_offline(tmp_path, monkeypatch):
    lent_gpu.copy_tokenizer(tmp_path)
    entry = next(tmp_path.iterdir())
    assert {p.name for p in entry.iterdir()} >= {"tokenizer.json", "config.json", "llm_envs_conversion.json"}
    assert not list(entry.glob("*.safetensors"))
    assert sum(p.stat().st_size for p in entry.iterdir()) < 8 * 2**20
    monkeypatch.setenv("LLM_ENVS_CACHE", str(tmp_path))
    from trainers.common.models import load_tokenizer

    assert load_tokenizer().encode("What is 12 x 7?")


def test_a_part_past_its_deadline_is_killed_with_its_children(tmp_path):
    child, script = tmp_path / "child.txt", tmp_path / "part.py"
    script.write_text("import subprocess, sys, time\nprint('started', flush=True)\n"
                      f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3); open(sys.argv[1], \"w\")', "
                      f"{str(child)!r}])\ntime.sleep(60)\n")
    start = time.monotonic()
    code = lent_gpu.stream([sys.executable, str(script)], tmp_path / "part.log", {}, 1.5)
    assert code == 124 and time.monotonic() - start < 10
    log = (tmp_path / "part.log").read_text()
    assert log.startswith("started") and "[lent_gpu: killed after 2 s]" in log
    time.sleep(3)
    assert not child.exists()  # its child went with it


def test_run_fits_its_parts_in_the_limit_and_ends_with_the_table_and_the_tally(tmp_path, monkeypatch, capsys):
    calls, clock = [], [0.0]

    def stream(command, log, env, timeout):  # each part takes all the time it is given
        calls.append((command, timeout))
        clock[0] += timeout
        if "benchmarks.gpu.speed" in command:
            Path(command[command.index("--out") + 1]).write_text("| what | ... |\n| generation | ... |\n")
        else:
            log.write_text("PASS  a\n1 passed, 0 skipped, 0 failed (of 1 checks)\n")
        return 0

    monkeypatch.setattr(lent_gpu, "stream", stream)
    monkeypatch.setattr(lent_gpu, "clock", lambda: clock[0])
    monkeypatch.setattr(lent_gpu, "LENT", tmp_path / "nothing")  # no wheels: says so and goes on
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert lent_gpu.main(["run", "--limit", "300"]) == 0
    (speed, speed_limit), (check, check_limit) = calls
    budget = float(speed[speed.index("--budget") + 1])
    assert budget + 30 < speed_limit and speed_limit + check_limit < 300 and check_limit > 60
    assert check[check.index("--out") + 1] != str(tmp_path)  # trainers' weights never under $OUT
    assert check[check.index("--out") + 1].startswith(str(tmp_path / "tmp"))
    assert not list((tmp_path / "tmp").iterdir())  # their temporary folder is gone after the run
    out = capsys.readouterr().out
    assert "no wheels under" in out and "no tokenizer under" in out
    tail = out[out.index("===== lent_gpu summary"):]
    assert "| generation | ... |" in tail and "gpu_check: 1 passed, 0 skipped, 0 failed" in tail


def test_the_cpu_rehearsal_runs_the_tiny_commands(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(lent_gpu, "stream", lambda command, *rest: calls.append(command) or 1)
    monkeypatch.setattr(lent_gpu, "LENT", tmp_path / "nothing")
    monkeypatch.setenv("OUT", str(tmp_path))
    assert lent_gpu.main(["run", "--cpu", "--only", "check"]) == 1  # a failing part fails the run
    assert len(calls) == 1 and calls[0][-4:] == ["--device", "cpu", "--arch", "tiny"]


def test_a_limit_under_a_minute_is_refused(capsys):
    with pytest.raises(SystemExit):
        lent_gpu.main(["run", "--limit", "30"])
    assert "--limit must be at least 60 seconds, not 30" in capsys.readouterr().err
