"""Speed: each command times one kind of work side by side in one run and prints ratios.

- ``es.py``: ES iterations per engine (full-rank, low-rank, plain generation as the ceiling).
- ``es_scale.py``: ES on several processes against one.
- ``rl.py``: a GRPO step, ours against TRL's.
- ``scoring.py``: completions scored per second per env.
- ``precision.py``: fp32 against bf16 (``compute_dtypes.py``: which dtype a run's matrix products ran in).
- ``logprobs_update.py``: the RL update's log-probs, before and after a change.
- ``perturbation_cast.py``: how much of a full-rank member survives the cast to bf16.
- ``presets.py``: each trainer's CPU preset per env: its estimate line next to its measured time.
"""
