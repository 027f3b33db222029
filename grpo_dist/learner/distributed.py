"""Data parallelism across learner ranks: each rank takes a share of every minibatch.

Every rank holds the whole policy and receives the whole batch (a few token ids per
completion); advantages, the minibatch order and each minibatch's loss denominator D are
computed from the whole batch, identically on every rank. A rank then runs forward and
backward on its share of the minibatch's rows only, with that global D, so the ranks' losses
(and gradients) add up to the whole minibatch's. After the last micro-batch one all-reduce
sums the float32 master gradients; every rank clips and steps the same sum, so the ranks
stay bit-identical without broadcasting weights.

That is the gradient all-reduce torch DDP performs, done by hand once per optimizer step:
it sums (DDP averages), it reduces the float32 master gradients (DDP reduces the compute
copies' bfloat16 ones), and it lets ranks run different numbers of micro-batches (a token
budget, a rank with no rows) without the collective mismatch DDP's per-backward hooks would
have. What it gives up is DDP's overlap of communication with the backward pass.

The no-grad passes (pi_ref, and pi_old when it is computed first) are shared out the same
way: each rank fills its rows, and a sum over ranks (the other rows are 0) gives everyone
the whole. With one rank every method here is a no-op, so the learner has one code path.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


class DataParallel:
    """This learner's rank among `world_size`; `DataParallel()` is the single-rank no-op.

    Collectives run on `device` (NCCL takes GPU tensors only); CPU tensors travel there and back.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu") -> None:
        self.rank, self.world_size, self.device = rank, world_size, device

    @classmethod
    def join(cls, host: str, port: int, rank: int, world_size: int, device: str, timeout_s: float) -> DataParallel:
        """Join the ranks' process group (rank 0 serves the rendezvous at host:port; NCCL on a GPU,
        gloo on the CPU); blocks until all have. A collective whose peer died or hung fails after
        `timeout_s` (learner.collective_timeout_s) rather than torch's default 30 minutes; the
        controller has usually noticed a death long before, from Ray."""
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rank, world_size, device)

    def shard(self, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """This rank's share of `rows`: dealt round-robin longest first, so that tokens balance."""
        if self.world_size == 1:
            return rows
        order = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
        return order[self.rank :: self.world_size]

    def pad(self, parts: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The micro-batches to run: these (ranks may run different numbers; sharded.py pads them)."""
        return parts

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over ranks, in place (and returned)."""
        if self.world_size > 1:
            on_device = tensor.to(self.device)
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
            tensor.copy_(on_device)
        return tensor

    def min_max(self, low: float, high: float) -> tuple[float, float]:
        """The smallest `low` and the largest `high` over ranks."""
        if self.world_size == 1:
            return low, high
        values = torch.tensor([-low, high], dtype=torch.float64, device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return -values[0].item(), values[1].item()

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks (a missing gradient counts as 0), in one flat all-reduce."""
        if self.world_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for param in params:
            param.grad = flat[offset : offset + param.numel()].view_as(param).clone()
            offset += param.numel()

    def broadcast(self, params: list[torch.nn.Parameter]) -> None:
        """Rank 0's values into every rank's `params` (at the start, as DDP does)."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for param in params:
                dist.broadcast(param.data, src=0)
