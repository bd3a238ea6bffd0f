"""Evolution Strategies (the paper's algorithm), one package: ``python -m trainers.es``.

- ``train.py``: the algorithm and the run, read top to bottom (options, the iteration, the loop).
- ``noise/``: the perturbations, below the engines that evaluate them: full-rank Gaussian noise
  (``fullrank.py``), low-rank populations (``lowrank.py``) and the member types an engine call takes
  (``members.py``).
- ``masters.py``: fp32 master copies of bf16 weights, on disk with each checkpoint.
- ``update_log.py``: every update's seeds and coefficients, what a resume replays.
- ``replay.py``: a run's model rebuilt from its logged seeds alone (``python -m trainers.es.replay``).
- ``start.py``: what a run says when it starts.
- ``presets.py``: the paper's hyperparameters and a CPU preset per env, and an iteration's cost here.

This file imports nothing: the engines import ``noise/``, and ``train.py`` imports the engines.
"""
