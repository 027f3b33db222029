"""Scoring functions for tests/test_scoring_pool.py; imported by the pool's worker processes."""

import os
import sys
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


def returns(prompt: str, completion: str) -> object:
    """What the completion names: none, text, a numeric string, huge (1e39: beyond float32), or a number."""
    return {"none": None, "text": "good", "numeric_text": "1.5", "huge": 1e39, "bool": True}.get(completion, 2.5)


def prints(prompt: str, completion: str) -> float:
    """Prints 8 MiB to stdout and stderr, then scores 1."""
    print("x" * (1 << 22), flush=True)
    print("y" * (1 << 22), file=sys.stderr, flush=True)
    return 1.0


def forks(prompt: str, completion: str) -> float:
    """Forks; the child returns too (it must not answer on the worker's pipe). Scores the length."""
    os.fork()
    return float(len(completion))


def leaves_a_sleeper(prompt: str, completion: str) -> float:
    """Forks a child that sleeps a minute and scores its pid."""
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    return float(child)
