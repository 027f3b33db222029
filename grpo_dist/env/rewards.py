"""The `env_reward` reward function: an episode's environment step rewards, summed (env/groups.py
passes them to rewards as the field `env_reward`; None when the environment failed)."""

from __future__ import annotations


async def env_reward(prompt: str, completion: str, env_reward: float | None = None, **fields: object) -> float:
    """The episode's summed step rewards; raises (so the sample scores reward.failure_score and is
    counted) when the environment failed or there was no episode. Async: a field lookup is awaited
    in the reward actor, with no scoring process to ship the transcript to."""
    if env_reward is None:
        raise ValueError("no environment reward: the episode's environment failed, or env is null")
    return float(env_reward)
