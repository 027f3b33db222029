"""Publishing weights: every policy version goes to every engine, and each engine proves it serves it.

`publish(version)` queues the learner's weights on every rollout worker without waiting (the
transport is a `weights.WeightSync`): each worker takes them after the calls queued before,
and before those sent after (Ray's per-caller actor ordering), so every chunk submitted later
samples the new version. With trainer.verify_weight_sync each push leaves a `PendingCheck`:
the checksum each worker will serve and the learner's own. The loop checks them once a chunk
sampled by that version is in (`verify_through`), so the check costs no wait of its own.

A worker that died or hung before it served a push is got back by `Retry` (retry.py), which
returns the workers that need weights; the publisher repairs them (`repair`: the current
weights again, always verified).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import ray

from grpo_dist.controller.actors import LearnerWatch
from grpo_dist.controller.retry import Retry
from grpo_dist.common.waits import ActorLost, CallTimeout, ObjectLost, cause_line, fetch, fetch_each, first_line
from grpo_dist.weights import WeightSync
from grpo_dist.weights.errors import WeightSyncError


@dataclass
class PendingCheck:
    """A push whose served checksums have not been compared with the learner's yet."""

    version: int
    serial: int  # the push's number, counting regular pushes and repairs
    served: dict[int, ray.ObjectRef]  # rollout worker -> the checksum it serves after the push
    expected: ray.ObjectRef  # the learner's checksum of the weights pushed


class WeightPublisher:
    """Sends the learner's weights to the rollout workers and checks what they serve."""

    def __init__(self, transport: WeightSync, learner_watch: LearnerWatch, rollouts: list[Any], retry: Retry, *,
                 verify: bool, timeout_s: float, version: int = 0) -> None:
        """`version`: the policy version the learner holds now (a resumed run's); `timeout_s`
        bounds each wait on a worker (trainer.call_timeout_s); `retry` gets back a worker that
        died or hung before it served a push."""
        self.transport, self.learner_watch, self.rollouts, self.retry = transport, learner_watch, rollouts, retry
        self.verify, self.timeout_s = verify, timeout_s
        self.version = version  # the latest version pushed (the learner's)
        self.pushes = 0  # pushes so far, regular and repairs: the serial number of the latest
        self.pending: deque[PendingCheck] = deque()
        self.repaired: dict[int, int] = {}  # rollout worker -> serial of the push that last repaired it
        self.verified = version if verify else -1  # the latest version whose served checksums were compared

    def publish(self, version: int) -> None:
        """Queue the learner's weights as `version` on every engine, without waiting."""
        self.version = version
        served = self.transport.submit(version)
        self.pushes += 1
        if self.verify:
            self.pending.append(PendingCheck(version, self.pushes, dict(enumerate(served)),
                                             self.learner_watch.actor.checksum.remote()))

    def repair(self, workers: list[int]) -> int:
        """Queue the current weights on each of these rollout workers (restarted, or sampling with
        other weights; a broadcast transport sends them to every worker), one push each, always
        verified. Returns the version they will serve: what is sent to them after it samples."""
        for index in workers:
            served = self.transport.repair([index], self.version)
            self.pushes += 1
            for worker in served:
                self.repaired[worker] = self.pushes
            expected = self.learner_watch.actor.checksum.remote()
            self.pending.append(PendingCheck(self.version, self.pushes, served, expected))
        return self.version

    def catch_up(self) -> None:
        """Rollout workers Ray restarted since the last look (between calls, say) get the current weights."""
        self.repair(self.retry.catch_up())

    def verify_through(self, version: int) -> None:
        """The served checksums of every push up to `version`, compared with the learner's
        (`served_through`); a worker that died before it took one is revived, one whose load hung
        is killed first (Retry.get_back), and each gets the current weights again."""
        lost, hung = self.served_through(version)
        self.repair(self.retry.get_back([("rollout", index) for index in lost],
                                        {("rollout", index): why for index, why in hung.items()}))

    def served_through(self, version: int) -> tuple[list[int], dict[int, str]]:
        """Compare the served checksums of every push up to `version` with the learner's
        (WeightSyncError on a mismatch). Returns the workers that need reviving: those that died
        before they took a push and were not repaired since, and those whose load did not finish
        within `timeout_s` (hung: worker -> what it did not finish). A load
        that failed is an error unless a worker of the same push died or hung (a broadcast fails
        for want of a rank: the group is formed again, every worker repaired) or it was repaired since."""
        lost: list[int] = []
        hung: dict[int, str] = {}
        while self.pending and self.pending[0].version <= version:
            check = self.pending.popleft()
            expected = self.learner_watch.call(check.expected, "checksum")
            workers = [index for index in check.served if index not in hung]  # (each waited for once)
            names = [f"rollout worker {index}: load weights version {check.version}" for index in workers]
            values = fetch_each([check.served[index] for index in workers], names, self.timeout_s, late_ok=True,
                                failures_ok=True)
            failed = []
            for index, value in zip(workers, values):
                if isinstance(value, CallTimeout):
                    hung[index] = first_line(value)
                elif isinstance(value, (ActorLost, ObjectLost)):  # (its node died: the same)
                    if self.repaired.get(index, 0) < check.serial and index not in lost:
                        lost.append(index)
                elif isinstance(value, ray.exceptions.RayTaskError):
                    if self.repaired.get(index, 0) < check.serial:
                        failed.append((index, cause_line(value)))
                elif value != expected:
                    raise WeightSyncError(f"rollout worker {index} does not serve the learner's weights "
                                          f"(version {check.version})")
            if failed and not (set(lost) | set(hung)) & set(check.served):
                index, why = failed[0]
                raise WeightSyncError(f"rollout worker {index}: load weights version {check.version} failed: {why}")
            self.verified = max(self.verified, check.version)
        return lost, hung

    def push_now(self, version: int) -> None:
        """Send `version` to every engine and wait until each serves it, verified whatever
        trainer.verify_weight_sync says (a resume)."""
        self.version = version
        self.transport.push(version)
        self.verify_all()

    def verify_all(self) -> None:
        """Every engine serves the learner's weights now (WeightSyncError names those that do not)."""
        # every side is asked at once: each hashes its whole model (about 0.5 s on the real one)
        refs = [*(w.checksum.remote() for w in self.rollouts), self.learner_watch.actor.checksum.remote()]
        names = [*(f"rollout worker {i}: checksum" for i in range(len(self.rollouts))), "learner: checksum"]
        *served, expected = fetch(refs, names, self.timeout_s)
        stale = [index for index, checksum in enumerate(served) if checksum != expected]
        if stale:
            raise WeightSyncError(f"rollout workers {stale} do not serve the learner's weights "
                                  f"(version {self.version})")
        self.verified = self.version
