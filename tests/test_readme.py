"""The README's and the docs' promises: the worked env example runs, CI runs the README's test
command, the scoring time bound names the code's constants, and the results block is what its
command renders from the committed studies.

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


def test_the_results_block_is_what_its_command_renders_from_the_committed_studies(monkeypatch):
    """The README's results and their details page are the headline command the README names, run
    on the studies committed under docs/: a study whose numbers changed without a re-render (the
    verdict lines no longer following them) fails here, with the command that fixes it."""
    from benchmarks.study import headline
    from conftest import readme_headline

    command, args = readme_headline()
    readme, page = Path(args.readme), Path(args.details)
    monkeypatch.chdir(ROOT)  # the command runs from the checkout's root, as the README says
    studies = [headline.load(Path(p)) for p in args.studies]
    block, details = headline.render_results(studies, readme, page)
    rules = {c for s in studies if (c := s.results["config"].get("rule_commit"))}
    history = all(subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT,
                                 capture_output=True).returncode == 0 for c in rules)
    # a copy without git's history (CI's second pass) cannot list the commits that amended the rule
    plain = (lambda text: text) if history else (
        lambda text: re.sub(r"; `verdicts\.py` changed since in [0-9a-f, ]+", "", text))

    def between(text: str, start: str, end: str) -> str:
        return plain(text.split(start + "\n", 1)[1].split(end, 1)[0])

    stale = f"stale: run `{command}`"
    assert between(readme.read_text(), headline.START, headline.END) == plain(block), stale
    assert between(page.read_text(), headline.DETAILS_START, headline.DETAILS_END) == plain(details), stale
