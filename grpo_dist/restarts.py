"""Rollout and reward actors that died and came back: noticed, counted, caught up.

Rollout and reward actors run with `max_restarts=cluster.max_restarts` and
`max_task_retries=0`. When such an actor's process dies, Ray starts it again and runs its
constructor anew (a rollout engine holds model.path's weights again; a reward actor gets a
fresh scoring pool and sandbox), but it never runs a call again by itself: the calls the
actor had received fail with RayActorError, and the controller decides what to send again.
Ray's own retries would be wrong twice over: a `generate` retried on a restarted engine
samples from the initial weights, and retried calls give up the order in which an actor runs
one caller's calls, which the loop relies on (each weight push before the chunks it samples).

What the controller does (trainer.py, pipeline.py): a chunk whose call failed, or whose
engine reports a policy version other than the one pushed before it (a worker that died and
restarted between two calls), is sent again after the worker was given the current weights;
a chunk whose scoring failed is scored again. `Restarts` reads how often Ray restarted each
actor from Ray's actor table, so every restart is counted once (`rollout/restarts`,
`reward/restarts`) however many calls it broke, and `ActorGone` ends the run once Ray has
given up on an actor.
"""

from __future__ import annotations

import time
from typing import Any

import ray

# A call whose actor died (ActorDiedError), is restarting (ActorUnavailableError), or whose
# input came from such a call (RayTaskError(...) is then a RayActorError too).
ActorLost = ray.exceptions.RayActorError

NAMES = {"rollout": "rollout worker", "reward": "reward actor", "learner": "learner"}


class ActorGone(RuntimeError):
    """An actor died once more than Ray restarts it (`cluster.max_restarts`)."""


def actor_state(handle: Any) -> tuple[str, int]:
    """(state, restarts) of an actor in Ray's actor table: ALIVE, RESTARTING, DEAD, ...

    The table lives in Ray's GCS; reading it needs no dashboard and never waits behind the
    actor's own calls (ray.util.state would need the dashboard).
    """
    record = ray._private.state.actors(actor_id=handle._actor_id.hex())
    return record["State"], int(record["NumRestarts"])


class Restarts:
    """How often Ray restarted each rollout and reward actor; `counters[f"{role}/restarts"]`
    grows by each restart once it is seen."""

    def __init__(self, actors: dict[str, list[Any]], counters: dict[str, float], max_restarts: int) -> None:
        self.actors, self.counters, self.max_restarts = actors, counters, max_restarts
        self.seen = {(role, index): 0 for role, handles in actors.items() for index in range(len(handles))}

    def check(self, role: str, index: int) -> bool:
        """Whether Ray restarted the actor since the last check; ActorGone when it is dead for good."""
        state, restarts = actor_state(self.actors[role][index])
        if state == "DEAD":
            raise ActorGone(f"{NAMES[role]} {index} died and Ray restarts it no more: it was restarted {restarts} "
                            f"times (cluster.max_restarts={self.max_restarts})")
        new = restarts - self.seen[(role, index)]
        if new > 0:
            self.seen[(role, index)] = restarts
            self.counters[f"{role}/restarts"] = self.counters.get(f"{role}/restarts", 0.0) + new
        return new > 0

    def wait_alive(self, role: str, index: int, timeout_s: float) -> None:
        """Block until the actor is ALIVE again (its constructor ran): with max_task_retries=0 a call
        sent while it restarts fails at once. ActorGone when Ray gave up on it or it is not back in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            state, _ = actor_state(self.actors[role][index])
            if state == "ALIVE":
                return
            if state == "DEAD":
                self.check(role, index)  # raises ActorGone
            if time.monotonic() > deadline:
                raise ActorGone(f"{NAMES[role]} {index} was not back within {timeout_s:.0f} s after its process died "
                                f"(state {state}; cluster.actor_start_timeout_s)")
            time.sleep(0.2)

    def which(self, lost: ActorLost) -> tuple[str, int] | None:
        """The (role, index) of the actor a lost call names (for a call whose input came from a
        lost call: that call's actor), or None when it is none of these."""
        for (role, index) in self.seen:
            if self.actors[role][index]._actor_id.hex() == getattr(lost, "actor_id", None):
                return role, index
        return None

    def poll(self) -> list[tuple[str, int]]:
        """The actors Ray restarted since the last look, as (role, index)."""
        return [(role, index) for role, index in self.seen if self.check(role, index)]
