"""Rewards the reward actor calls in its own process (inline and batched), bounded: the calls run
one after another on a daemon thread, each under a deadline, and their output is capped.

A call past its deadline cannot be stopped (Python cannot kill a thread): it is left running on its
thread, which ends with the actor; the caller decides what then (worker.py). A call that holds the
GIL without a break (a regular expression backtracking in C) blocks the actor itself: only
`trainer.call_timeout_s` ends that, killing the actor.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from grpo_dist.reward.pool import OUTPUT_LIMIT, CappedOutput

T = TypeVar("T")


@dataclass
class Calls(Generic[T]):
    """What a run of calls got to: the results of those that returned, in order, and the thread,
    still running the next, when that one passed its deadline (else None)."""

    results: list[T] = field(default_factory=list)
    stuck: threading.Thread | None = None


def call_in_order(calls: Sequence[Callable[[], T]], timeout_s: float, name: str) -> Calls[T]:
    """Run `calls` one after another on a daemon thread named `name`, each under `timeout_s`; stop
    at the first past its deadline. What a call raises (BaseException too) is raised here."""
    done = Calls[T]()
    lock, finished = threading.Lock(), threading.Event()
    started, abandoned, raised = [time.monotonic()], [False], []

    def serve() -> None:
        try:
            for call in calls:
                with lock:
                    if abandoned[0]:
                        return
                    started[0] = time.monotonic()
                result = call()
                with lock:
                    if abandoned[0]:
                        return
                    done.results.append(result)
        except BaseException as exc:  # raised in the caller's thread instead
            raised.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=serve, daemon=True, name=name)
    thread.start()
    while not finished.wait(max(0.0, started[0] + timeout_s - time.monotonic())):
        with lock:
            if not finished.is_set() and time.monotonic() >= started[0] + timeout_s:
                abandoned[0] = True
                done.stuck = thread
                return done
    if raised:
        raise raised[0]
    return done


@contextlib.contextmanager
def capped_output(limit: int = OUTPUT_LIMIT) -> Iterator[None]:
    """While inside, this process's `sys.stdout` and `sys.stderr` pass on the first `limit`
    characters each (the scoring pool's cap, here per call of a function on a chunk)."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = CappedOutput(streams[0], limit), CappedOutput(streams[1], limit)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = streams
