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
# A value lost with the node whose object store held it (a dead node; the rollout and reward
# actors' results live in their node's store), which Ray cannot make again (max_retries=0).
ObjectLost = ray.exceptions.ObjectLostError


class CallTimeout(TimeoutError):
    """An actor call ran past its limit; the message names the actor, the stage and the field."""


def late_refs(refs: list[ray.ObjectRef], timeout_s: float, *, fail_fast: bool = False) -> list[ray.ObjectRef]:
    """Wait at most `timeout_s` until every ref is done (or failed); returns those that are not.
    `fail_fast`: raise the first failure as soon as it is known (a learner rank's peers may be
    blocked in a collective meanwhile)."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1 if fail_fast else len(pending),
                                 timeout=max(0.0, deadline - time.monotonic()), fetch_local=False)
        if not done or not fail_fast:
            break
        ray.get(done)  # raises the failure now
    return pending


def timeout_error(refs: list[ray.ObjectRef], names: list[str], late: list[ray.ObjectRef], timeout_s: float,
                  limit: str = "trainer.call_timeout_s") -> CallTimeout:
    """The CallTimeout that names the `late` ones of `refs` and `limit`, the field that set the time."""
    late_set = set(late)
    where = "; ".join(dict.fromkeys(name for ref, name in zip(refs, names) if ref in late_set))
    return CallTimeout(f"{where}: not done after {timeout_s:g} s ({limit})")


def wait_all(refs: list[ray.ObjectRef], names: list[str], timeout_s: float, *,
             limit: str = "trainer.call_timeout_s", fail_fast: bool = False) -> None:
    """Wait at most `timeout_s` until every ref is done (or failed); CallTimeout names the late
    ones and `limit` (see `late_refs` for `fail_fast`)."""
    late = late_refs(refs, timeout_s, fail_fast=fail_fast)
    if late:
        raise timeout_error(refs, names, late, timeout_s, limit)


def fetch(refs: list[ray.ObjectRef], names: list[str], timeout_s: float, **options: Any) -> list[Any]:
    """The values of `refs`, waiting at most `timeout_s` for all of them (see `wait_all`)."""
    wait_all(refs, names, timeout_s, **options)
    return ray.get(refs)


def fetch_each(refs: list[ray.ObjectRef], names: list[str], timeout_s: float, *,
               late_ok: bool = False, failures_ok: bool = False) -> list[Any]:
    """`fetch`, except that a call whose actor died, or whose value was lost with its node, gives
    its ActorLost or ObjectLost error in its place; with
    `late_ok`, a call not done after `timeout_s` gives its CallTimeout in its place (the caller
    decides what a hung actor costs) instead of raising one for all; with `failures_ok`, a call
    that raised gives its error (a RayTaskError) in its place."""
    late = late_refs(refs, timeout_s)
    if late and not late_ok:
        raise timeout_error(refs, names, late, timeout_s)
    values: list[Any] = []
    for ref, name in zip(refs, names):
        if ref in late:
            values.append(timeout_error([ref], [name], [ref], timeout_s))
            continue
        try:
            values.append(ray.get(ref))
        except (ActorLost, ObjectLost) as lost:
            values.append(lost)
        except ray.exceptions.RayTaskError as failed:
            if not failures_ok:
                raise
            values.append(failed)
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
