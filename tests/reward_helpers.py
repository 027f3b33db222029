"""Batched and async rewards for tests/test_reward_worker.py (imported through the registry)."""

import asyncio
import math

from grpo_dist.reward.registry import batched


@batched
def batched_length(prompts: list[str], completions: list[str], scale: float = 1.0, **fields: list) -> list[float]:
    """len(completion) * scale; raises on "boom", returns NaN for "nan", one score too few for "short"."""
    if "boom" in completions:
        raise RuntimeError("boom")
    if "short" in completions:
        return [0.0] * (len(completions) - 1)
    return [math.nan if text == "nan" else scale * len(text) for text in completions]


@batched
class Counter:
    """Built once per worker: counts its calls, scores each sample with the call number."""

    def __init__(self, start: int = 0) -> None:
        self.calls = start

    def __call__(self, prompts: list[str], completions: list[str], **fields: list) -> list[float]:
        self.calls += 1
        return [float(self.calls)] * len(completions)


async def async_sleep(prompt: str, completion: str, **fields: object) -> float:
    """Sleeps float(completion) seconds and returns it."""
    seconds = float(completion)
    await asyncio.sleep(seconds)
    return seconds
