"""The study: the paper's claims tested in one command (``python -m benchmarks.study``), ES against
GRPO, Dr.GRPO and PPO over seeds and grids at an equal sample budget.

- ``driver.py``: the command, from options to report (the protocol in its docstring).
- ``config.py``: what a study is (options, identity, methods, labels).
- ``plan.py``: its runs and their trainer flags; ``run.py``: training and measuring one run;
  ``record.py``: what is kept of a run (its record, its evaluated completions).
- ``curves.py``: learning curves, each method's selected grid runs continued to larger budgets.
- ``report.py``: the tables and plots; ``rerender.py``: a finished study's report written anew.
- ``errors.py``: the test set's standard errors over distinct prompts; ``machines.py``: which
  machine trained what (verdicts hold, and costs are given, per machine).
- ``verdicts.py``: the rules that turn a study into the paper's four claims' verdicts (and round
  three's pre-registered question); ``headline.py``: the README's results block from finished studies.
- ``evidence.py``: the counts behind a study's numbers, and rescoring from its completions.
- ``status.py``: where a running study stands; ``task_selection.py``: which task the default model
  partly solves (how a study's task is chosen).
- ``pilot_multiturn.py``: the second multi-turn pilot's commands (ES and Dr.GRPO on episodes that
  end at stop strings, before and after), run in order and resumable.
"""
