"""The state dict through the Ray object store: stored once per version, loaded by every worker."""

from __future__ import annotations

from typing import Any

import ray

from grpo_dist.common.waits import CallTimeout, fetch
from grpo_dist.weights.errors import WeightSyncError


class ObjectStoreSync:
    """The `WeightSync` for CPUs and shared GPUs: one object-store copy per version."""

    def __init__(self, learner: Any, rollouts: list[Any], verify: bool = True, timeout_s: float = 300.0) -> None:
        self.learner, self.rollouts, self.verify, self.timeout_s = learner, rollouts, verify, timeout_s
        self.exported: ray.ObjectRef | None = None  # the latest export: what the workers' loads wait for

    def setup(self) -> None:
        pass

    def submit(self, version: int) -> list[ray.ObjectRef]:
        weights = self.exported = self.learner.export_weights.remote()  # an ObjectRef: stored once
        return [w.load_weights.remote(weights, version, self.verify) for w in self.rollouts]

    def push(self, version: int) -> list[str | None]:
        served = self.submit(version)
        names = [f"rollout worker {index}: load weights version {version}" for index in range(len(served))]
        try:
            return fetch(served, names, self.timeout_s, limit="trainer.weight_sync_timeout_s")
        except CallTimeout as late:
            raise WeightSyncError(str(late)) from None

    def repair(self, workers: list[int], version: int) -> dict[int, ray.ObjectRef]:
        weights = self.exported = self.learner.export_weights.remote()
        return {index: self.rollouts[index].load_weights.remote(weights, version, True) for index in workers}

    def export_in_flight(self) -> ray.ObjectRef | None:
        return self.exported

    def close(self) -> None:
        pass
