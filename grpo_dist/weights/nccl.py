"""Weight broadcast over NCCL: the learner (rank 0) to every vLLM engine worker (ranks 1..N).

The learner and the engine workers form a process group of their own, created for this
purpose (`nccl_communicator`, vLLM's NCCL wrapper, imported only when it is used), so neither
side's torch.distributed state is touched. Each policy version travels as the buckets of a
plan (buckets.py), one broadcast each, in plan order.

NCCL cannot put two ranks on one GPU: the learner and the engines need distinct devices.
The caller bounds the wait (a broadcast whose peer never comes blocks): `NcclSync` below,
which the trainer uses when `trainer.weight_sync` resolves to nccl, and `deploy/gpu_smoke.py`.

The same orchestration runs on the CPU with backend="gloo" (`GlooCommunicator`, a torch
gloo group outside torch.distributed's global state): that is how the tests exercise it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any, Literal, Protocol

import ray
import torch

from grpo_dist.weights.buckets import DEFAULT_BUCKET_BYTES, Bucket, pack, unpack
from grpo_dist.weights.errors import WeightSyncError

Backend = Literal["nccl", "gloo"]


class Communicator(Protocol):
    """The one collective used here (vLLM's PyNcclCommunicator has it)."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> None: ...


def send(communicator: Communicator, tensors: dict[str, torch.Tensor], buckets: list[Bucket],
         device: torch.device | str) -> None:
    """Learner side (rank 0): broadcast every bucket, in plan order."""
    for bucket in buckets:
        communicator.broadcast(pack(tensors, bucket, device), src=0)


def receive(communicator: Communicator, buckets: list[Bucket], device: torch.device | str
            ) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine side: receive bucket by bucket, yielding (name, tensor) as each bucket lands.

    Lazy, so that a consumer that copies each tensor away (vLLM's weight loader) holds one
    bucket at a time.
    """
    for bucket in buckets:
        buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
        communicator.broadcast(buffer, src=0)
        yield from unpack(buffer, bucket).items()


class GlooCommunicator:
    """A CPU stand-in for the NCCL communicator: a gloo group of its own (rank 0 serves the store)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        self.group = ProcessGroupGloo(PrefixStore("grpo_weights", self.store), rank, world_size, timeout)
        self.rank, self.world_size = rank, world_size

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        from torch.distributed import BroadcastOptions

        options = BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.broadcast([tensor], options).wait()


def communicator(backend: Backend, host: str, port: int, rank: int, world_size: int,
                 device: torch.device | str, timeout_s: float) -> Communicator:
    """Join the weight group at host:port as `rank`; rank 0 must be the sender (the learner)."""
    if backend == "gloo":
        return GlooCommunicator(host, port, rank, world_size, timeout_s)
    return nccl_communicator(host, port, rank, world_size, device, timeout_s)


def nccl_communicator(host: str, port: int, rank: int, world_size: int, device: torch.device | str,
                      timeout_s: float) -> Communicator:
    """A NCCL group of its own for weight updates, outside torch.distributed's global state.

    Rank 0 (the learner) serves the rendezvous store at host:port; joining waits at most
    timeout_s. vLLM's wrappers (GPU only) are imported here, so that nothing else needs vLLM.
    """
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    device = torch.device(device)
    if device.index is None:  # PyNccl compares devices exactly: "cuda" != "cuda:0"
        device = torch.device("cuda", torch.cuda.current_device())
    group = StatelessProcessGroup.create(
        host=host, port=port, rank=rank, world_size=world_size, store_timeout=int(timeout_s)
    )
    communicator = PyNcclCommunicator(group, device=device)
    if communicator.disabled:  # no NCCL library: every broadcast would silently do nothing
        raise RuntimeError("NCCL is not available here: the weight group cannot be created")
    return communicator


def engine_rank_offsets(num_workers: int, tensor_parallel_size: int) -> list[int]:
    """The weight-group rank of each rollout worker's first engine worker (the learner is rank 0)."""
    return [1 + index * tensor_parallel_size for index in range(num_workers)]


class NcclSync:
    """The `WeightSync` (weights/__init__.py) that broadcasts from the learner to every engine worker.

    `setup` forms the group: the learner (rank 0) serves the rendezvous at an address on its
    own node, rollout worker i's engine workers join as ranks 1 + i*tp .. (i+1)*tp, world size
    1 + workers*tp. `push` sends one version, bucket by bucket; every wait is bounded by
    `timeout_s` and a timeout raises WeightSyncError. `repair` forms the group again around
    restarted workers. backend="gloo" runs the same on the CPU.
    """

    def __init__(self, learner: Any, rollouts: list[Any], *, tensor_parallel_size: int = 1,
                 timeout_s: float = 300.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES, verify: bool = True,
                 backend: Backend = "nccl") -> None:
        self.learner, self.rollouts = learner, rollouts
        self.tensor_parallel_size, self.timeout_s = tensor_parallel_size, timeout_s
        self.bucket_bytes, self.verify, self.backend = bucket_bytes, verify, backend
        self.world_size = 1 + len(rollouts) * tensor_parallel_size
        self.plan: list[Bucket] | None = None
        self.sent: ray.ObjectRef | None = None  # the learner's side of the latest broadcast
        self.joining = False
        self.regroups = 0  # times the group was formed again for restarted workers

    def setup(self) -> None:
        host, port = ray.get(self.learner.weight_group_address.remote(), timeout=self.timeout_s)
        offsets = engine_rank_offsets(len(self.rollouts), self.tensor_parallel_size)
        joined = [self.learner.join_weight_group.remote(host, port, self.world_size, self.timeout_s, self.backend)]
        joined += [worker.join_weight_group.remote(host, port, offset, self.world_size, self.timeout_s, self.backend)
                   for worker, offset in zip(self.rollouts, offsets)]
        self.joining = True
        self._wait(joined, f"forming the weight group of {self.world_size} ranks at {host}:{port}")
        [self.plan] = self._wait([self.learner.weight_plan.remote(self.bucket_bytes)], "learner: weight_plan")

    def submit(self, version: int, verify: bool | None = None) -> list[ray.ObjectRef]:
        """Queue the broadcast on the learner and every worker. It is a collective: it runs once
        each of them has finished what was queued before it (the learner waits for the slowest).
        `verify`: whether the workers compute the checksum they serve (default: self.verify)."""
        if self.plan is None:
            raise RuntimeError("NcclSync.submit before setup")
        verify = self.verify if verify is None else verify
        self.sent = self.learner.send_weights.remote(self.plan)
        return [w.receive_weights.remote(self.plan, version, self.timeout_s, verify) for w in self.rollouts]

    def push(self, version: int) -> list[str | None]:
        received = self.submit(version)
        return self._wait([self.sent, *received], f"broadcasting version {version}")[1:]

    def repair(self, workers: list[int], version: int) -> dict[int, ray.ObjectRef]:
        """Take restarted workers back: a restarted engine is a new process outside the group, and
        a broadcast waits for every rank, so the group is formed again between two versions. The
        latest broadcast ends first on the learner (done, or failed for want of the dead rank;
        at most `timeout_s`), every member leaves (a survivor stuck in a receive from the dead
        rank leaves once its receive gives up, after at most `timeout_s`), all join a fresh
        rendezvous, and version `version` goes to every engine: a collective needs all ranks, and
        a survivor may have missed the last broadcast. Returns every worker's served checksum."""
        if self.sent is not None:
            ray.wait([self.sent], timeout=self.timeout_s)  # (its failure is the dead rank's: nothing to raise)
        self.close(wait_s=self.timeout_s)
        self.setup()
        self.regroups += 1
        return dict(enumerate(self.submit(version, verify=True)))

    def export_in_flight(self) -> None:
        """None: the learner's send is one of the broadcast's calls, waited on with the workers'."""
        return None

    def close(self, wait_s: float = 10.0) -> None:
        """Every member leaves the group; waits at most `wait_s` (at most timeout_s) for them."""
        if not self.joining:
            return
        self.plan, self.joining = None, False
        every = [self.learner, *self.rollouts]
        ray.wait([actor.leave_weight_group.remote() for actor in every], num_returns=len(every),
                 timeout=min(self.timeout_s, wait_s))

    def _wait(self, futures: list, what: str) -> list:
        try:
            return ray.get(futures, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise WeightSyncError(
                f"{what}: not done after {self.timeout_s:.0f} s (trainer.weight_sync_timeout_s)"
            ) from None

