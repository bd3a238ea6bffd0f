"""ES and RL fine-tuning: each algorithm family a package, what both use in ``common/``.

- ``es/``: Evolution Strategies (``python -m trainers.es``): the algorithm read top to bottom
  (``train.py``), its noise, fp32 masters, update log, replay and start.
- ``rl/``: GRPO, Dr.GRPO (``python -m trainers.grpo``) and PPO (``python -m trainers.ppo``): the
  algorithms, the loop they share, losses, log-probs, sampling, policy, checkpoints and sharding
  over several processes (FSDP2).
- ``common/``: what both families use: config and CLI, the runtime resolved once (model, dtype,
  engine), run directories, models, LoRA adapters (``--lora-rank``), precision, rollouts and
  episodes, splits, budgets, held-out evaluation, progress, processes.
- ``engines/``: generation behind one interface: Hugging Face ``generate``, a native decode loop,
  vLLM.
- ``grpo.py``, ``ppo.py``: the RL entry points; ``sweep.py``: a hyperparameter grid selected on
  validation, reported on test; ``merge.py``: a LoRA run's adapter merged into a full model;
  ``trl.py``: our envs in TRL's ``GRPOTrainer``.

Which part may import which is stated in ``tests/test_layout.py``: the engines know the
perturbations (``es/noise/``) and the progress display, never ES or RL.
"""
