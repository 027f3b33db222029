"""Scoring functions for tests/test_scoring_pool.py; imported by the pool's worker processes."""

import os
import time


def length(prompt: str, completion: str, scale: float = 1.0) -> float:
    return scale * len(completion)


def raises(prompt: str, completion: str) -> float:
    raise ValueError(f"bad completion {completion!r}")


def hangs(prompt: str, completion: str) -> float:
    while True:
        time.sleep(60)


def non_finite(prompt: str, completion: str) -> float:
    return float(completion)


def exits(prompt: str, completion: str) -> float:
    os._exit(3)


def sleeps(prompt: str, completion: str, seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def obeys(prompt: str, completion: str) -> float:
    """"exit" kills the worker, "hang" never returns, anything else scores its length."""
    if completion == "exit":
        os._exit(3)
    if completion == "hang":
        hangs(prompt, completion)
    return float(len(completion))
