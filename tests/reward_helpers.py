"""Batched, inline and async rewards for tests (imported through the registry)."""

import asyncio
import math
import os
import sys
import time

from grpo_dist.reward.registry import batched, inline


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


def known_correct_count(prompt: str, group_size: int) -> int:
    """How many of a group's samples `first_correct` scores 1: fixed by the prompt, 0..group_size."""
    return sum(map(ord, prompt)) % (group_size + 1)


@batched
def first_correct(prompts: list[str], completions: list[str], group_size: int, **fields: list) -> list[float]:
    """1.0 for the first known_correct_count(prompt, group_size) samples of each group, whatever
    they say, else 0.0: a group is a run of equal consecutive prompts (a scoring call holds whole
    groups, their samples in order)."""
    scores, position = [], 0
    for index, prompt in enumerate(prompts):
        position = position + 1 if index and prompt == prompts[index - 1] else 0
        scores.append(float(position < known_correct_count(prompt, group_size)))
    return scores


@inline
def inline_digits(prompt: str, completion: str, **fields: object) -> float:
    """The completion read as a number (raises on anything else); notes the process it ran in in PIDS."""
    PIDS.add(os.getpid())
    return float(completion)


PIDS: set[int] = set()


def always_raises(prompt: str, completion: str, **fields: object) -> float:
    """A reward that fails on every sample (a sample reward: it runs in the scoring pool)."""
    raise RuntimeError("the reward broke")


def signed_length(prompt: str, completion: str, scale: float = 1.0, **fields: object) -> float:
    """(len(completion) - 4) * scale: with scale 1e37 every score is a finite float32, but their
    advantages and the loss are not."""
    return (len(completion) - 4) * scale


async def async_blocks(prompt: str, completion: str, **fields: object) -> float:
    """Blocks its event loop for float(completion) seconds (a sync sleep in an async reward)."""
    time.sleep(float(completion))  # noqa: ASYNC251 - on purpose
    return 1.0


def hang_for(completion: str) -> None:
    """For "sleep N" sleeps N seconds, for "spin N" runs a Python loop N seconds (a hang that
    ends, so that a thread left running it does not outlive the test by much)."""
    how, _, seconds = completion.partition(" ")
    end = time.monotonic() + float(seconds or 0)
    if how == "sleep":
        time.sleep(float(seconds))
    while how == "spin" and time.monotonic() < end:
        pass


@inline
def inline_hangs(prompt: str, completion: str, **fields: object) -> float:
    """Hangs on "sleep N" and "spin N" (hang_for), else the completion read as a number."""
    hang_for(completion)
    return float(completion.split()[-1])


@batched
def batched_hangs(prompts: list[str], completions: list[str], **fields: list) -> list[float]:
    """Hangs on the batch's first completion (hang_for), then scores each completion's length."""
    hang_for(completions[0])
    return [float(len(text)) for text in completions]


MEBIBYTE = 1 << 20


def print_megabytes() -> None:
    """1 MiB of "x" to stdout and of "y" to stderr."""
    print("x" * MEBIBYTE, flush=True)
    print("y" * MEBIBYTE, file=sys.stderr, flush=True)


@inline
def inline_prints(prompt: str, completion: str, **fields: object) -> float:
    print_megabytes()
    return 1.0


async def async_prints(prompt: str, completion: str, **fields: object) -> float:
    print_megabytes()
    return 1.0


@batched
def batched_prints(prompts: list[str], completions: list[str], **fields: list) -> list[float]:
    for _ in completions:
        print_megabytes()
    return [1.0] * len(completions)
