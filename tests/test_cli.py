"""Every command explains itself: each ``python -m`` entry point under trainers/, eval/ and
benchmarks/ (found here, so a new one is covered without editing this file) answers ``--help``
with exit code 0, and a bad flag or value with one line on stderr and exit code 2, never a
traceback."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAIN_GUARD = re.compile(r"^if __name__ == ['\"]__main__['\"]:", re.MULTILINE)


def entry_points() -> list[str]:
    """Modules of trainers/, eval/ and benchmarks/ that ``python -m`` runs: a package with a
    ``__main__.py``, or a module with a main guard."""
    found = []
    for package in ("trainers", "eval", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if path.name == "__main__.py":
                found.append(module.removesuffix(".__main__"))
            elif path.name != "__init__.py" and MAIN_GUARD.search(path.read_text()):
                found.append(module)
    return found


ENTRY_POINTS = entry_points()


# Runs ``python -m MODULE --help``, then the bad flags its help suggests, in one process (each a
# fresh ``runpy`` run of the module, which is what ``python -m`` does), so that the suite pays for
# torch's import once per entry point rather than once per probe.
PROBE = r"""
import contextlib, io, json, re, runpy, sys, traceback
module, numeric_flag = sys.argv[1], re.compile(sys.argv[2])

def run(args):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [module, *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit:  # as the interpreter maps it: None is 0, a message is 1
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    return {"args": args, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

helped = run(["--help"])
probes = [["--no-such-flag"]]
numeric = numeric_flag.search(helped["stdout"])
if numeric:  # a flag that takes a number, given a word
    probes.append([numeric.group(1), "many"])
print(json.dumps([helped, *map(run, probes)]))
"""
NUMERIC_FLAG = r"(--[\w-]+) (?:INT|FLOAT)\b"


def probe(module: str) -> list[dict]:
    """``--help``, then each bad-flag probe: their args, exit code, stdout and stderr."""
    # From the checkout, so its packages are the ones imported.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROBE, module, NUMERIC_FLAG], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_kind_of_entry_point_is_found():
    assert {"trainers.es", "trainers.grpo", "trainers.ppo", "trainers.sweep", "trainers.es.replay", "eval", "eval.table",
            "eval.plot", "benchmarks.study", "benchmarks.speed.scoring"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_and_bad_flags(module):
    helped, *bad_flags = probe(module)
    assert helped["code"] == 0 and helped["stdout"].startswith("usage: python -m "), helped["stderr"]
    assert bad_flags[0]["args"] == ["--no-such-flag"]
    for bad in bad_flags:
        lines = bad["stderr"].strip().splitlines()
        assert bad["code"] == 2 and len(lines) == 1 and "Traceback" not in bad["stderr"], (bad["args"], bad["stderr"])
        assert lines[0].startswith(f"python -m {module}: error: "), lines
