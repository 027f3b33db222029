"""Rollout workers and their generation engines."""
