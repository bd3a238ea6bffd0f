"""On a GPU: ``check.py`` (every CUDA path, pass/fail), ``speed.py`` (one table against the GPU's
limits) and ``lent.py`` (a lent GPU's work as one prepared call; ``python -m benchmarks.lent_gpu``)."""
