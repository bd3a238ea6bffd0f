"""``python -m benchmarks.lent_gpu prepare|run``: the lent GPU's launcher (``benchmarks/gpu/lent.py``),
under the name the developers' brief gives it. Standard library alone, as the launcher."""

import sys

from benchmarks.gpu.lent import main

if __name__ == "__main__":
    sys.exit(main())
