"""What every trainer uses (ES and RL alike): config and CLI (``config.py``), run directories
(``run_dir.py``), models (``models.py``), rollouts (``rollout.py``), splits (``splits.py``), sample
budgets (``budget.py``), progress and projections (``progress.py``), processes (``distributed.py``)."""
