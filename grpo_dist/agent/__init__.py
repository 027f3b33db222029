"""Agents against an OpenAI-compatible endpoint on the rollout workers (docs/agents.md)."""
