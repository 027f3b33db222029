"""Weight transport: how each policy version reaches the rollout engines, and how to prove it arrived.

The controller moves each policy version with one `WeightSync` strategy, chosen by
`trainer.weight_sync` (`make_weight_sync`):

- `ObjectStoreSync` (object_store.py): the learner returns its state dict from a Ray method,
  which places it in the object store once per version; every rollout worker loads that one
  reference in place.
- `NcclSync` (nccl.py): the learner broadcasts to every engine worker over a process group
  of their own (GPU engines; gloo stands in on the CPU), in the buckets of one plan (buckets.py).

Either way `push` returns the checksum (checksum.py) each worker now serves, which the
controller compares with the learner's; a transport that fails raises `WeightSyncError`
(errors.py). This package imports nothing from rollout/: the engines import it, not the
other way round.
"""

from __future__ import annotations

from typing import Any, Protocol

from grpo_dist.weights.object_store import ObjectStoreSync


class WeightSync(Protocol):
    """How the controller moves the learner's weights to the rollout workers."""

    def setup(self) -> None:
        """Prepare the transport (once, after the actors start)."""
        ...

    def submit(self, version: int) -> list[Any]:
        """Start sending the learner's current weights as `version`, without waiting: one
        object reference per worker to the checksum it will serve (None when verification is
        off). Each actor runs these calls after those submitted before and before those
        submitted after, so every worker takes the weights between two of its requests."""
        ...

    def push(self, version: int) -> list[str | None]:
        """`submit`, then wait (at most trainer.weight_sync_timeout_s): one served checksum per worker."""
        ...

    def repair(self, workers: list[int], version: int) -> dict[int, Any]:
        """Send the learner's current weights as `version` to these workers (restarted ones),
        without waiting for them to arrive: worker -> a reference to the checksum it will serve,
        always computed, for every worker that is sent them (a broadcast sends to all)."""
        ...

    def export_in_flight(self) -> Any | None:
        """The reference to the learner's latest export, which the workers' loads wait on, where
        the transport has one apart from the workers' calls (the object store's); else None (a
        broadcast's send waits on every worker, so it would tell nothing of the learner alone)."""
        ...

    def close(self) -> None:
        """Release the transport; safe after a failed or missing `setup`."""
        ...


def make_weight_sync(config: Any, learner: Any, rollouts: list[Any]) -> WeightSync:
    """The strategy `trainer.weight_sync` asks for (auto resolved by `config.resolve_weight_sync`)."""
    from grpo_dist.config.schema import resolve_weight_sync

    trainer = config.trainer
    if resolve_weight_sync(config) == "nccl":
        from grpo_dist.weights.nccl import NcclSync

        return NcclSync(learner, rollouts, tensor_parallel_size=config.rollout.vllm.tensor_parallel_size,
                        timeout_s=trainer.weight_sync_timeout_s, bucket_bytes=trainer.weight_sync_bucket_mb << 20,
                        verify=trainer.verify_weight_sync)
    return ObjectStoreSync(learner, rollouts, verify=trainer.verify_weight_sync, timeout_s=trainer.weight_sync_timeout_s)


__all__ = ["ObjectStoreSync", "WeightSync", "make_weight_sync"]
