"""Bounded waits on Ray calls: every wait of the controller, the learner group and evaluation.

A wait names what it waits for (`names[i]`: which actor computes `refs[i]` at which stage)
so that one that runs out of time says where, and what config field set the limit.
"""

from __future__ import annotations

import time
from typing import Any

import ray

# A call whose actor died (ActorDiedError), is restarting (ActorUnavailableError), or whose
# input came from such a call (RayTaskError(...) is then a RayActorError too).
ActorLost = ray.exceptions.RayActorError


class CallTimeout(TimeoutError):
    """An actor call ran past its limit; the message names the actor, the stage and the field."""


def wait_all(refs: list[ray.ObjectRef], names: list[str], timeout_s: float, *,
             limit: str = "trainer.call_timeout_s", fail_fast: bool = False) -> None:
    """Wait at most `timeout_s` until every ref is done (or failed); CallTimeout names the late
    ones and `limit`, the field that set the time. `fail_fast`: raise the first failure as soon
    as it is known (a learner rank's peers may be blocked in a collective meanwhile)."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1 if fail_fast else len(pending),
                                 timeout=max(0.0, deadline - time.monotonic()), fetch_local=False)
        if not done or not fail_fast:
            break
        ray.get(done)  # raises the failure now
    if pending:
        late = set(pending)
        where = "; ".join(dict.fromkeys(name for ref, name in zip(refs, names) if ref in late))
        raise CallTimeout(f"{where}: not done after {timeout_s:g} s ({limit})")


def fetch(refs: list[ray.ObjectRef], names: list[str], timeout_s: float, **options: Any) -> list[Any]:
    """The values of `refs`, waiting at most `timeout_s` for all of them (see `wait_all`)."""
    wait_all(refs, names, timeout_s, **options)
    return ray.get(refs)


def fetch_each(refs: list[ray.ObjectRef], names: list[str], timeout_s: float) -> list[Any]:
    """`fetch`, except that a call whose actor died gives its ActorLost error in its place."""
    wait_all(refs, names, timeout_s)
    values = []
    for ref in refs:
        try:
            values.append(ray.get(ref))
        except ActorLost as lost:
            values.append(lost)
    return values


def first_line(error: BaseException) -> str:
    """The first line of an error's message (Ray's run to dozens of lines)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def cause_line(error: BaseException) -> str:
    """What went wrong inside an actor, in one line: the exception a Ray task raised, else the
    last line of Ray's message (where its traceback ends in the error)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {first_line(cause)}"
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
