"""The learner's end of the weight-update group (weights/nccl.py): rank 0, the sender."""

from __future__ import annotations

import torch

from grpo_dist.net import free_port
from grpo_dist.weights import nccl
from grpo_dist.weights.buckets import Bucket


class WeightGroup:
    """Joins the group as rank 0 and broadcasts state dicts bucket by bucket."""

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
