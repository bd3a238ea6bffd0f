"""``python -m trainers.ppo``: PPO with a separate critic (the algorithm: ``trainers/rl/ppo.py``)."""

from trainers.rl.ppo import main

if __name__ == "__main__":
    main()
