"""What every trainer uses (ES and RL alike): config and CLI (``config.py``; its parser in ``cli.py``),
run directories (``run_dir.py``), models (``models.py``; the default model's fetch and conversion in
``default_model.py``), the compute dtype (``precision.py``, the one place that decides it), rollouts
(``rollout.py``), splits (``splits.py``), sample budgets (``budget.py``), progress and projections
(``progress.py``), processes (``distributed.py``), held-out evaluation (``held_out.py``); and ES's
run machinery: its update log (``update_log.py``), fp32 masters on disk (``masters.py``) and start
messages (``es_start.py``)."""
