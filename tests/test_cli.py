"""Every command explains itself: each ``python -m`` entry point under trainers/, eval/ and
benchmarks/ (found here, so a new one is covered without editing this file) answers ``--help``
with exit code 0, and a bad flag or value with one line on stderr and exit code 2, never a
traceback."""

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


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    # From the checkout, so its packages are the ones imported.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_every_kind_of_entry_point_is_found():
    assert {"trainers.es", "trainers.grpo", "trainers.ppo", "trainers.sweep", "trainers.es.replay", "eval", "eval.table",
            "eval.plot", "benchmarks.study", "benchmarks.speed.scoring"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_and_bad_flags(module):
    helped = run(module, "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m "), helped.stderr
    probes = [["--no-such-flag"]]
    numeric = re.search(r"(--[\w-]+) (?:INT|FLOAT)\b", helped.stdout)
    if numeric:  # a flag that takes a number, given a word
        probes.append([numeric.group(1), "many"])
    for args in probes:
        bad = run(module, *args)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and "Traceback" not in bad.stderr, (args, bad.stderr)
        assert lines[0].startswith(f"python -m {module}: error: "), lines
