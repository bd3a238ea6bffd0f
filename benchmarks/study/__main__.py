"""``python -m benchmarks.study``: a whole study in one command (``driver.py``)."""

from benchmarks.study.driver import main

main()
