"""Trainers (Evolution Strategies, RL baselines) and the shared model/generation layer they use."""
