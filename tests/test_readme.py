"""The README's and the docs' promises: the worked env example runs, CI runs the README's test
command, and the scoring time bound names the code's constants.

Where claims live: README.md holds the two commands, what the main job shows and the headline
results; each topic's claims are on its page in docs/ (docs/README.md lists them). The example
is in docs/writing-an-env.md, the time bound in docs/reliability.md; tests/test_docs.py checks
the links between them all."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def test_new_env_example_runs(tmp_path):
    page = (DOCS / "writing-an-env.md").read_text()
    block = page.split("<!-- new-env-example -->", 1)[1]
    code = re.search(r"```python\n(.*?)```", block, re.DOTALL).group(1)
    script = tmp_path / "my_envs.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, re.MULTILINE)
    assert len(commands) == 2, "README must open with the main-job and the test command"
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_ci_runs_the_tests_again_without_shared_data():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".ci/without-shared python -m pytest -q" in lines


def test_without_shared_runs_in_a_copy_that_cannot_see_shared():
    probe = ("import os, llm_envs; print(os.getcwd()); print(os.path.exists('../shared'));"
             "print(os.path.isfile('tests/conftest.py')); print(llm_envs.__file__)")
    # the bound only stops a hung copy: importing the package took 88 s beside a study on 2 cores
    result = subprocess.run([str(ROOT / ".ci" / "without-shared"), sys.executable, "-c", probe],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    cwd, shared_visible, has_tests, package = result.stdout.splitlines()
    assert Path(cwd) != ROOT and (shared_visible, has_tests) == ("False", "True")
    assert Path(package).is_relative_to(cwd)  # the copy's code is what runs, not the checkout's
    assert not Path(cwd).exists()  # and the copy is deleted afterwards


def test_the_scoring_time_bound_is_stated_with_the_codes_constants():
    """The docs' time bound of a worker-mode call (docs/reliability.md) names the kill grace and
    the worker start timeout the code uses."""
    from llm_envs.scoring import GRACE, START_TIMEOUT

    text = " ".join((DOCS / "reliability.md").read_text().split())
    assert f"a grace of {GRACE:g} s (`GRACE`" in text
    assert f"at most {START_TIMEOUT:.0f} s, `START_TIMEOUT`" in text
    assert f"at most `score_timeout` + {GRACE:g} s per timed-out completion, plus a worker restart" in text
