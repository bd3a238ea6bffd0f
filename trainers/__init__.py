"""ES and RL fine-tuning: the algorithms here, one file each, read top to bottom; their parts below.

- ``es.py``, ``grpo.py``, ``ppo.py``: the algorithms (``python -m trainers.es|grpo|ppo``).
- ``sweep.py``: a hyperparameter grid selected on validation, reported on test.
- ``replay.py``: an ES run's model rebuilt from its logged seeds alone.
- ``rl/``: what only the RL methods need: the shared loop, losses, log-probs, sampling, policy, checkpoints,
  and sharding over several processes (FSDP2).
- ``common/``: what every trainer uses: config and CLI, run directories, models, precision (the one dtype decision),
  rollouts, splits, budget, progress, processes; ES's update log and masters.
- ``engines/``: generation behind one interface: Hugging Face ``generate``, a native decode loop, vLLM.
- ``noise/``: ES perturbations: full-rank Gaussian noise, low-rank populations, what an engine call evaluates.

Folders import only downwards in that list (``tests/test_layout.py``): an algorithm uses ``rl/``,
``common/``, ``engines/`` and ``noise/``; the engines know perturbations, never ES or RL.
"""
