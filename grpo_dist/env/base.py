"""The environment API: text in, text out. The rollout worker owns the tokens (env/trajectory.py).

An episode is one `Environment` instance: `reset(row)` gives the opening messages (or a
prompt string, for a model without a chat template), then each model reply goes to
`step(reply)`, which answers with a `Step`: new messages (or text) to append, an optional
reward for this step, whether the episode is over, and free-form info. Either method may be
`async def`; it is awaited. `check_opening` and `check_step` turn a malformed answer into an
`EnvError`, which costs that episode and never the run.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from grpo_dist.common.coroutines import CoroutineLoop

Message = dict[str, str]
Observation = Union[list[Message], str]


class EnvError(RuntimeError):
    """An environment that raised, answered malformed, or hung past its deadline: the episode fails."""


@dataclass(frozen=True)
class Step:
    """What the environment answers to one reply.

    `observation`: messages (chat) or text to append before the model's next turn (empty or
    None when `done`: nothing is appended after the last turn); `reward`: this step's reward, summed into the episode's (None: 0);
    `done`: the episode is over; `info`: recorded with the episode and given to rewards.
    """

    observation: Observation | None = ""
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment:
    """Subclass and implement `reset` and `step` (either may be async). One instance per
    episode, built with the configured `env.kwargs` as keyword arguments.

    `seed` is the episode's seed, set before `reset`: draw any randomness from
    `random.Random(self.seed)`, so that a chunk generated again (after a worker restart, or
    on resume) plays the same episodes.
    """

    seed: int = 0

    def reset(self, row: dict[str, Any]) -> Observation:
        """The episode's opening: a list of {role, content} messages, or a prompt string."""
        raise NotImplementedError

    def step(self, reply: str) -> Step:
        """Answer the model's reply (its text, without the end-of-turn token)."""
        raise NotImplementedError


async def call(method: Any, *args: Any, coroutines: CoroutineLoop | None = None) -> Any:
    """`method(*args)`, awaited when it is a coroutine function: on `coroutines` when given (a
    loop of another thread), so that a caller's deadline fires even when the environment blocks
    that loop with a sync call. A sync one runs on a thread of `_THREADS`, so that a slow
    step does not hold up the other episodes' steps, and one that hangs past its deadline is
    abandoned without keeping the process from exiting."""
    if inspect.iscoroutinefunction(method):
        if coroutines is None:
            return await method(*args)
        return await coroutines.run(method(*args))
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():  # a caller that timed out has cancelled it
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            result, error = method(*args), None
        except BaseException as exc:  # noqa: BLE001 - any failure of the environment is the episode's
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop has closed: nobody waits for this answer any more
            pass

    _THREADS.run(run)
    return await future


class DaemonThreads:
    """Daemon threads that run one job at a time and wait for the next, a new one started only
    when none is idle. A job that never returns keeps its thread and nothing else: the next job
    gets another. (Starting a thread per call cost about 2 ms a call on a loaded 2-core machine.)"""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()

    def run(self, job: Callable[[], None]) -> None:
        with self.lock:
            start = self.idle == 0
            self.idle -= 0 if start else 1
        if start:
            threading.Thread(target=self._serve, args=(job,), daemon=True, name="env-call").start()
        else:
            self.jobs.put(job)

    def _serve(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self.lock:
                self.idle += 1
            job = self.jobs.get()


_THREADS = DaemonThreads()


def check_messages(value: Any, what: str) -> list[Message]:
    """`value` as a list of {role, content} string messages, or an EnvError naming `what`."""
    if not isinstance(value, (list, tuple)):
        raise EnvError(f"{what} must be a list of messages or a string, got {type(value).__name__}")
    messages = []
    for position, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise EnvError(f"{what}[{position}] must be a dict with string 'role' and 'content', "
                           f"got {str(message)[:80]}")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def check_opening(value: Any) -> Observation:
    """reset()'s answer, checked: a non-empty prompt string or a non-empty list of messages."""
    if isinstance(value, str):
        if not value:
            raise EnvError("reset() returned an empty prompt")
        return value
    messages = check_messages(value, "reset()")
    if not messages:
        raise EnvError("reset() returned no messages")
    return messages


def check_step(value: Any) -> Step:
    """step()'s answer, checked: a Step with an observation of the right kind (unless done: then
    None or empty is nothing to append), a finite reward or None, a bool done and a dict info."""
    if not isinstance(value, Step):
        raise EnvError(f"step() must return a Step, got {type(value).__name__}")
    if not isinstance(value.done, bool):
        raise EnvError(f"Step.done must be a bool, got {value.done!r}")
    if value.reward is not None and not (isinstance(value.reward, (int, float)) and not isinstance(value.reward, bool)
                                         and math.isfinite(value.reward)):
        raise EnvError(f"Step.reward must be a finite number or None, got {value.reward!r}")
    if not isinstance(value.info, dict):
        raise EnvError(f"Step.info must be a dict, got {type(value.info).__name__}")
    if value.observation is None and not value.done:
        raise EnvError("Step.observation is None but the episode is not done")
    observation = "" if value.observation is None else value.observation if isinstance(
        value.observation, str) else check_messages(value.observation, "Step.observation")
    if not value.done and not observation:
        raise EnvError("Step.observation is empty but the episode is not done")
    return Step(observation=observation, reward=None if value.reward is None else float(value.reward),
                done=value.done, info=value.info)


def solved_turn(infos: list[dict[str, Any]]) -> int | None:
    """The turn (from 1) whose step info first says `correct: True`, 0 when none does; None when
    no step reports `correct` at all (the environment does not say what solving is)."""
    if not any("correct" in info for info in infos):
        return None
    return next((turn for turn, info in enumerate(infos, 1) if info.get("correct") is True), 0)
