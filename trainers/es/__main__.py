"""``python -m trainers.es``: the ES trainer (``train.py``)."""

from trainers.es.train import main

main()
