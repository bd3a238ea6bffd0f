"""What only the RL methods need: the loop GRPO and PPO share (``loop.py``), losses (``losses.py``),
log-probs (``logprobs.py``), sampling (``sampling.py``), the policy and optimizer (``policy.py``),
checkpoints (``checkpoints.py``), the CPU presets and a step's cost here (``presets.py``), ``--deterministic``
(``determinism.py``) and, on several processes, FSDP2 sharding and what ranks exchange (``sharding.py``)."""
