"""Multi-turn environments (docs/multiturn.md): environments speak text, the rollout worker owns the tokens.

base.py: the Environment API and Step; registry.py: environments by name; config.py: the `env`
section; render.py: a chat template taken apart; trajectory.py: an episode as ids and masks;
runner.py: episodes run turn-batched over a generation engine.
"""

from grpo_dist.env.base import EnvError, Environment, Step

__all__ = ["EnvError", "Environment", "Step"]
