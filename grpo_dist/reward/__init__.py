"""Reward workers and the reward functions they run."""
