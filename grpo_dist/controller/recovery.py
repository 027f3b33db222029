"""Recovery: rollout and reward actors that died and came back are noticed, counted and caught up.

Rollout and reward actors run with `max_restarts=cluster.max_restarts` and
`max_task_retries=0`. When such an actor's process dies, Ray starts it again and runs its
constructor anew (a rollout engine holds model.path's weights again; a reward actor gets a
fresh scoring pool and sandbox), but it never runs a call again by itself: the calls the
actor had received fail with RayActorError, and the controller decides what to send again.
Ray's own retries would be wrong twice over: a `generate` retried on a restarted engine
samples from the initial weights, and retried calls give up the order in which an actor runs
one caller's calls, which the loop relies on (each weight push before the chunks it samples).

The `Supervisor` keeps the actors serving; Retry (retry.py), the one owner of waits on their
calls, asks it to `revive` the actor of a call that failed, or of a chunk whose engine reports a
policy version other than the one pushed before it (a worker that died and restarted between
two calls). It sends no weights: the rollout workers it revived get the current weights from
the WeightPublisher before their chunks are sent again. It reads how often Ray restarted each
actor from Ray's actor table, so every restart is counted once (`rollout/restarts`,
`reward/restarts`) however many calls it broke; it counts every chunk sent again
(`rollout/retries`, `reward/retries`), and ends the run with ActorGone once Ray has given up on
an actor, or ChunkFailed once a chunk was sent again too often. The learner is never restarted:
`LearnerWatch` turns its death into LearnerLost.

A hung actor is a dead one. A rollout worker whose call (generate, a weight load) is not done
after trainer.call_timeout_s (a stuck engine, a frozen process) is killed (`kill_hung`:
`ray.kill` with restarts allowed, so Ray starts it again as after a kill -9), counted in
`rollout/hangs` as well as in its restarts, and its calls are sent again like a dead actor's.
A late reward call may only be waiting for a hung engine's output (a reward actor runs its
calls in order), so `kill_unresponsive` asks the rollout workers first, then the reward
actors (`reward/hangs`). Only the learner's hang ends the run (CallTimeout).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from grpo_dist.controller.actors import LearnerWatch, actor_state
from grpo_dist.controller.errors import ActorGone, ChunkFailed
from grpo_dist.common.waits import ActorLost, late_refs

NAMES = {"rollout": "rollout worker", "reward": "reward actor"}
# Run totals (kept in checkpoints); each step logs what it added.
RESTART_COUNTERS = ("rollout/restarts", "rollout/retries", "rollout/hangs",
                    "reward/restarts", "reward/retries", "reward/hangs")


class Supervisor:
    """Keeps the rollout and reward actors serving, and counts what it took (see the module docstring).

    It never sends weights: what it revives it returns, and the caller has the rollout workers
    among them repaired (WeightPublisher.repair)."""

    def __init__(self, actors: dict[str, list[Any]], learner_watch: LearnerWatch, *,
                 max_restarts: int, start_timeout_s: float, counters: dict[str, float] | None = None) -> None:
        self.actors, self.learner_watch = actors, learner_watch
        self.max_restarts, self.start_timeout_s = max_restarts, start_timeout_s
        self.max_retries = max_restarts + 1  # attempts of one chunk beyond its first
        self.counters = {name: 0.0 for name in RESTART_COUNTERS} | (counters or {})
        self.seen = {(role, index): 0 for role, handles in actors.items() for index in range(len(handles))}

    def revive(self, role: str, index: int) -> None:
        """An actor lost a call or sampled with the wrong weights: wait until Ray has it back and
        count the restart (ActorGone once Ray gave up; LearnerLost when the learner is the culprit).
        A rollout worker then needs the current weights before anything else is sent to it."""
        self.learner_watch.check_alive()
        self.wait_alive(role, index)
        self.check(role, index)

    def catch_up(self) -> list[int]:
        """The rollout workers Ray restarted since the last look (between calls, say), once they are
        back (a call sent while an actor restarts fails at once): they need the current weights."""
        back = []
        for role, index in self.seen:
            if self.check(role, index) and role == "rollout":
                self.wait_alive(role, index)
                back.append(index)
        return back

    def kill_hung(self, role: str, index: int, why: str) -> None:
        """The actor's call `why` ran past its time: kill its process so that Ray starts it again,
        count it in `<role>/hangs`, and wait until Ray has begun the restart (so that `revive`
        waits for the new process, not the old one). ActorGone when Ray will not restart it; the
        learner's CallTimeout when the weights a rollout worker waits for never left the learner."""
        self.learner_watch.check_alive()
        if role == "rollout":
            self.learner_watch.check_exported()
        handle = self.actors[role][index]
        _, before = actor_state(handle)
        ray.kill(handle, no_restart=False)
        self.counters[f"{role}/hangs"] += 1
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            state, restarts = actor_state(handle)
            if restarts > before or state == "DEAD":
                return  # (revive waits for ALIVE and counts the restart, or raises ActorGone)
            if time.monotonic() > deadline:
                raise ActorGone(f"{NAMES[role]} {index} hung ({why}) and was not restarted within "
                                f"{self.start_timeout_s:.0f} s (cluster.actor_start_timeout_s)")
            time.sleep(0.1)

    def kill_unresponsive(self, why: str, grace_s: float) -> list[tuple[str, int]]:
        """After a wait ran past its time without saying whose call hung (a reward call may wait on
        a hung engine's output, an evaluation's calls are chained): every actor that does not answer
        a no-op call within `grace_s` (it runs after the calls queued before it) is hung, and is
        killed and revived. Rollout workers first: only when they all answer are the reward
        actors' calls free of hung inputs and asked. Returns the (role, index) of those killed."""
        for role in ("rollout", "reward"):
            probes = [handle.__ray_ready__.remote() for handle in self.actors.get(role, [])]
            late = set(late_refs(probes, grace_s))
            hung = [index for index, probe in enumerate(probes) if probe in late]
            for index in hung:
                self.kill_hung(role, index, why)
            for index in hung:
                self.revive(role, index)
            if hung:
                return [(role, index) for index in hung]
        return []

    def count_retry(self, role: str, attempts: int, stage: str, why: str) -> None:
        """A chunk is sent again for the `attempts`-th time: counted in `<role>/retries`;
        ChunkFailed past `max_retries` (cluster.max_restarts + 1)."""
        if attempts > self.max_retries:
            raise ChunkFailed(f"{stage}: gave up after {self.max_retries} retries: {why}")
        self.counters[f"{role}/retries"] += 1

    def which(self, lost: ActorLost) -> tuple[str, int] | None:
        """The (role, index) of the actor a lost call names (for a call whose input came from a
        lost call: that call's actor), or None when it is none of these."""
        for role, index in self.seen:
            if self.actors[role][index]._actor_id.hex() == getattr(lost, "actor_id", None):
                return role, index
        return None

    def check(self, role: str, index: int) -> bool:
        """Whether Ray restarted the actor since the last check; ActorGone when it is dead for good."""
        state, restarts = actor_state(self.actors[role][index])
        if state == "DEAD":
            raise ActorGone(f"{NAMES[role]} {index} died and Ray restarts it no more: it was restarted {restarts} "
                            f"times (cluster.max_restarts={self.max_restarts})")
        new = restarts - self.seen[(role, index)]
        if new > 0:
            self.seen[(role, index)] = restarts
            self.counters[f"{role}/restarts"] += new
        return new > 0

    def wait_alive(self, role: str, index: int) -> None:
        """Block until the actor is ALIVE again (its constructor ran): with max_task_retries=0 a call
        sent while it restarts fails at once. ActorGone when Ray gave up on it or it is not back in time."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            state, _ = actor_state(self.actors[role][index])
            if state == "ALIVE":
                return
            if state == "DEAD":
                self.check(role, index)  # raises ActorGone
            if time.monotonic() > deadline:
                raise ActorGone(f"{NAMES[role]} {index} was not back within {self.start_timeout_s:.0f} s after its "
                                f"process died (state {state}; cluster.actor_start_timeout_s)")
            time.sleep(0.2)
