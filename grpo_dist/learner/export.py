"""The policy's weights on their way to the engines: the object store, the weight group, the checksum.

A policy every rank holds whole (`WholeExport`: precision.MasterWeights, lora.LoraWeights) hands
over one state dict. A sharded one (`ShardedExport`: sharded.ShardedWeights) is gathered a bucket
at a time, every rank joining each gather and rank 0 alone putting or sending it: no rank ever
holds the whole policy. The Learner calls either without asking which it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from grpo_dist.common.net import free_port
from grpo_dist.weights import nccl
from grpo_dist.weights.buckets import Bucket, plan_buckets
from grpo_dist.weights.checksum import WireStateDict, export_state_dict, state_checksum, stream_checksum


class WeightGroup:
    """The learner's end of the weight-update group (weights/nccl.py): rank 0, the sender."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.communicator: nccl.Communicator | None = None

    @staticmethod
    def address() -> tuple[str, int]:
        """Where this node can serve the group's rendezvous: its IP and a free port."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def join(self, host: str, port: int, world_size: int, timeout_s: float, backend: nccl.Backend) -> None:
        self.communicator = nccl.communicator(backend, host, port, 0, world_size, self.device, timeout_s)

    def send(self, tensors: dict[str, torch.Tensor], buckets: list[Bucket]) -> None:
        """Broadcast `tensors` in the plan's buckets; returns when they have left this device."""
        if self.communicator is None:
            raise RuntimeError("send_weights before join_weight_group")
        nccl.send(self.communicator, tensors, buckets, self.device)
        if self.device != "cpu":
            torch.cuda.synchronize(self.device)

    def leave(self) -> None:
        self.communicator = None


class WholeExport:
    """Weights out of a policy held whole: everything derives from `served_state_dict`."""

    def served_state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def export(self, bucket_bytes: int) -> dict[str, torch.Tensor]:
        """The served weights in one state dict (through Ray it lands in the object store once)."""
        return export_state_dict(self.served_state_dict())

    def checksum(self) -> str:
        return state_checksum(self.served_state_dict())

    def weight_plan(self, bucket_bytes: int) -> list[Bucket]:
        return plan_buckets(self.served_state_dict(), bucket_bytes)

    def send(self, group: WeightGroup, buckets: list[Bucket]) -> None:
        group.send(self.served_state_dict(), buckets)


class ShardedExport:
    """Weights out of a sharded policy, bucket by bucket; every method is a collective (every rank calls it)."""

    rank: int  # this rank; rank 0 alone puts and sends

    def served_names(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def gather(self, names: list[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def buckets(self, bucket_bytes: int, dtype: torch.dtype | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """The served weights, gathered a bucket of at most `bucket_bytes` at a time (a larger tensor alone)."""
        for bucket in plan_buckets(self.served_names(), bucket_bytes):
            yield self.gather([slot.name for slot in bucket.slots], dtype)

    def export(self, bucket_bytes: int) -> list[Any] | None:
        """Each gathered bucket put in the object store by rank 0 before the next is gathered: rank 0
        returns the buckets' ObjectRefs, the others None."""
        import ray

        refs = []
        for bucket in self.buckets(bucket_bytes):
            if self.rank == 0:
                refs.append(ray.put(WireStateDict(bucket)))
        return refs if self.rank == 0 else None

    def checksum(self) -> str:
        """`state_checksum` of the served weights, gathered one tensor at a time in name order."""
        return stream_checksum((name, self.gather([name])[name]) for name in sorted(self.served_names()))

    def weight_plan(self, bucket_bytes: int) -> list[Bucket]:
        return plan_buckets(self.served_names(), bucket_bytes)

    def send(self, group: WeightGroup, buckets: list[Bucket]) -> None:
        """Every rank gathers each bucket; rank 0 sends it before the next is gathered."""
        for bucket in buckets:
            tensors = self.gather([slot.name for slot in bucket.slots])
            if self.rank == 0:
                group.send(tensors, [bucket])
