"""What both algorithm families use (ES and RL alike; ``tests/test_layout.py`` keeps it so):

- ``runtime.py``: the runtime resolved once (the model's config, the compute dtype, the engine);
- ``config.py``: options and the command line (its parser in ``cli.py``);
- ``run_dir.py``: run directories (``files.py``: atomic writes; ``tracking.py``: what a run logs, sent
  to TensorBoard, W&B or Trackio);
- ``models.py``: loading and saving models (``default_model.py``: the default model's fetch and
  conversion); ``precision.py``: the compute dtype's rules and probe; ``hardware.py``: this machine;
- ``rollout.py``: generate and score (``episodes.py``: multi-turn episodes); ``held_out.py``: the
  held-out evaluation a run logs; ``splits.py``: train, validation and test; ``budget.py``: sample
  budgets;
- ``progress.py``: progress bars and the run's time projection; ``sizing.py``: the run's preset and
  its whole-run estimate from a probe, said before the first work;
- ``distributed.py``: several processes.
"""
