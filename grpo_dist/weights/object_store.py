"""The state dict through the Ray object store: stored once per version, loaded by every worker."""

from __future__ import annotations

from typing import Any

import ray


class ObjectStoreSync:
    """The `WeightSync` for CPUs and shared GPUs: one object-store copy per version."""

    def __init__(self, learner: Any, rollouts: list[Any], verify: bool = True) -> None:
        self.learner, self.rollouts, self.verify = learner, rollouts, verify

    def setup(self) -> None:
        pass

    def submit(self, version: int) -> list[ray.ObjectRef]:
        weights = self.learner.export_weights.remote()  # an ObjectRef: stored once
        return [w.load_weights.remote(weights, version, self.verify) for w in self.rollouts]

    def push(self, version: int) -> list[str | None]:
        return ray.get(self.submit(version))

    def close(self) -> None:
        pass
