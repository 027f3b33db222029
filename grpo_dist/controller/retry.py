"""Failed calls, in one place: wait for calls, get back the actors that died or hung, say what to send again.

Every wait on a rollout or reward call goes through `Retry` (the pipeline's chunks, an
evaluation, the weight loads the publisher hands over). It waits at most trainer.call_timeout_s,
and sorts what went wrong:

    the actor died (ActorLost)              revive it: Ray restarts it, the Supervisor waits and counts
    its result was lost with a node         revive the actor that made it (ObjectLost)
    (ObjectLost)
    the call hung (CallTimeout)             kill the actor (`kill`), or every actor that does not
                                            answer (`probe`: a reward call may wait on a hung engine)

It sends nothing itself: it says which calls to send again, and returns the rollout workers that
came back, which need the current weights (WeightPublisher.repair) before anything is sent to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import ray

from grpo_dist.controller.recovery import Supervisor
from grpo_dist.common.waits import ActorLost, CallTimeout, ObjectLost, fetch_each, first_line

Actor = tuple[str, int]  # (role, index): ("rollout", 1) is rollout worker 1


@dataclass(frozen=True)
class Call:
    """A call to wait for: its result, its name in messages, the actor that runs it, and `source`,
    the actor whose result it takes as input (lost with its node: that actor is got back)."""

    ref: ray.ObjectRef
    name: str
    actor: Actor
    source: Actor | None = None


@dataclass
class Waited:
    """What a wait found: each call's result or the error in its place, and what to do next."""

    values: list[Any]
    again: dict[int, str] = field(default_factory=dict)  # position -> why: send again (its actor is back)
    late: list[int] = field(default_factory=list)  # positions to wait for again (`probe`: hung actors killed)
    needs_weights: list[int] = field(default_factory=list)  # rollout workers back, each once: repair before sending


class Retry:
    """The one owner of "wait for this call; if its actor died, hung or lost its result, get it back"."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def wait(self, calls: list[Call], timeout_s: float, late: Literal["kill", "probe"] = "kill") -> Waited:
        """Wait for every call, at most `timeout_s` (trainer.call_timeout_s). A dead actor, or the source of a lost result, is revived and its call
        is to be sent again. A late call with `kill`: its actor is killed and revived, the call sent
        again; with `probe`: the actors that do not answer are (Supervisor.kill_unresponsive) and the
        call is waited for again, or its CallTimeout raised when every actor answers (slow, not hung)."""
        values = fetch_each([call.ref for call in calls], [call.name for call in calls], timeout_s, late_ok=True)
        waited = Waited(values)
        late_ones = [position for position, value in enumerate(values) if isinstance(value, CallTimeout)]
        if late_ones and late == "probe":
            waited.needs_weights += self.kill_unresponsive(values[late_ones[0]], timeout_s)
            waited.late = late_ones
        hung: dict[Actor, str] = {}
        lost: list[Actor] = []
        for position, (call, value) in enumerate(zip(calls, values)):
            if isinstance(value, CallTimeout) and late == "kill":
                hung.setdefault(call.actor, first_line(value))
            elif isinstance(value, ActorLost):
                lost.append(call.actor)
            elif isinstance(value, ObjectLost):
                lost.append(call.source or call.actor)
            else:
                continue
            waited.again[position] = first_line(value)
        back = [*waited.needs_weights, *self.get_back(lost, hung)]  # a worker may be both probed and lost
        waited.needs_weights = list(dict.fromkeys(back))  # each once, in order: one repair each
        return waited

    def get_back(self, actors: Iterable[Actor], hung: dict[Actor, str] | None = None) -> list[int]:
        """Kill the `hung` actors (actor -> what it did not finish) and revive them and `actors`, each
        once; returns the rollout workers among them, which need the current weights."""
        hung = hung or {}
        for (role, index), why in hung.items():
            self.supervisor.kill_hung(role, index, why)
        back = sorted({*actors, *hung})
        for role, index in back:
            self.supervisor.revive(role, index)
        return [index for role, index in back if role == "rollout"]

    def recover(self, error: ActorLost | ObjectLost | CallTimeout, grace_s: float) -> list[int]:
        """After a chain of calls failed with `error` (an evaluation, whose calls name no single
        actor): get back the actor it names, or the hung ones (those that do not answer within
        `grace_s`); raises `error` when none can be. Returns the rollout workers that need the
        current weights."""
        if isinstance(error, CallTimeout):
            return self.kill_unresponsive(error, grace_s)
        where = self.supervisor.which(error)
        if where is None:
            if isinstance(error, ActorLost):
                raise error
            return []  # a result lost with its node: `catch_up` finds the actors Ray restarted
        return self.get_back([where])

    def count_retry(self, role: str, attempts: int, stage: str, why: str) -> None:
        """A call is sent again for the `attempts`-th time: counted in `<role>/retries`; ChunkFailed
        past the bound (Supervisor.count_retry)."""
        self.supervisor.count_retry(role, attempts, stage, why)

    def catch_up(self) -> list[int]:
        """The rollout workers Ray restarted since the last look: they need the current weights."""
        return self.supervisor.catch_up()

    def kill_unresponsive(self, late: CallTimeout, grace_s: float) -> list[int]:
        """The hung actors killed and revived (`late` raised when none is): the rollout workers among them."""
        killed = self.supervisor.kill_unresponsive(first_line(late), grace_s)
        if not killed:
            raise late
        return [index for role, index in killed if role == "rollout"]
