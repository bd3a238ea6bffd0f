"""``python -m trainers.grpo``: GRPO and Dr.GRPO (the algorithm: ``trainers/rl/grpo.py``)."""

from trainers.rl.grpo import main

if __name__ == "__main__":
    main()
