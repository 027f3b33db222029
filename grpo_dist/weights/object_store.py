"""The state dict through the Ray object store: stored once per version, loaded by every worker."""

from __future__ import annotations

from typing import Any

import ray

from grpo_dist.weights.errors import WeightSyncError


class ObjectStoreSync:
    """The `WeightSync` for CPUs and shared GPUs: one object-store copy per version."""

    def __init__(self, learner: Any, rollouts: list[Any], verify: bool = True, timeout_s: float = 300.0) -> None:
        self.learner, self.rollouts, self.verify, self.timeout_s = learner, rollouts, verify, timeout_s

    def setup(self) -> None:
        pass

    def submit(self, version: int) -> list[ray.ObjectRef]:
        weights = self.learner.export_weights.remote()  # an ObjectRef: stored once
        return [w.load_weights.remote(weights, version, self.verify) for w in self.rollouts]

    def push(self, version: int) -> list[str | None]:
        served = self.submit(version)
        try:
            return ray.get(served, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WeightSyncError(f"rollout workers: load weights version {version}: not done after "
                                  f"{self.timeout_s:g} s (trainer.weight_sync_timeout_s)") from None

    def repair(self, workers: list[int], version: int) -> list[ray.ObjectRef]:
        weights = self.learner.export_weights.remote()
        return [self.rollouts[index].load_weights.remote(weights, version, True) for index in workers]

    def close(self) -> None:
        pass
