"""Bucketed weight broadcast (weights/buckets.py, weights/nccl.py), with a loopback in place of NCCL.

The NCCL transport itself needs two GPUs and is not exercised here; the plan, the packing
and the order of collectives are.
"""

import subprocess
import sys

import torch

from grpo_dist.weights.buckets import ALIGN, plan_buckets
from grpo_dist.weights.nccl import receive, send


class Loopback:
    """Records what rank 0 broadcasts, then plays it back to a receiving rank in order."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []
        self.receiving = False

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        assert src == 0
        if self.receiving:
            tensor.copy_(self.sent.pop(0))
        else:
            self.sent.append(tensor.clone())


def weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(50, 16, generator=generator),  # 3200 bytes
        "layer.0.weight": torch.randn(16, 16, generator=generator).to(torch.bfloat16),  # 512
        "layer.0.bias": torch.randn(3, generator=generator).to(torch.bfloat16),  # 6: misaligns the next
        "layer.0.scale": torch.tensor(2.5),  # a 0-dim tensor
        "steps": torch.tensor([7, 8, 9], dtype=torch.int64),
        "head.weight": torch.randn(16, 50, generator=generator).t(),  # not contiguous
    }


def test_plan_keeps_order_limit_and_alignment():
    tensors = weights()
    buckets = plan_buckets(tensors, bucket_bytes=1024)
    assert [s.name for b in buckets for s in b.slots] == list(tensors)
    for bucket in buckets:
        assert all(slot.offset % ALIGN == 0 for slot in bucket.slots)
        assert len(bucket.slots) == 1 or bucket.nbytes <= 1024  # only a lone tensor may exceed it
    assert [s.name for s in buckets[0].slots] == ["embed.weight"]  # 3200 bytes > 1024: alone
    assert [s.name for s in buckets[1].slots] == ["layer.0.weight", "layer.0.bias", "layer.0.scale"]


def test_broadcast_round_trip_is_bit_exact_with_one_collective_per_bucket():
    tensors = weights()
    buckets = plan_buckets(tensors, bucket_bytes=1024)
    link = Loopback()
    send(link, tensors, buckets, "cpu")
    assert len(link.sent) == len(buckets)
    link.receiving = True
    received = dict(receive(link, buckets, "cpu"))
    assert list(received) == list(tensors) and not link.sent
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def test_one_bucket_when_everything_fits():
    assert len(plan_buckets(weights(), bucket_bytes=1 << 20)) == 1


def test_the_weights_package_imports_nothing_from_rollout_nor_vllm():
    code = ("import sys, grpo_dist.weights, grpo_dist.weights.buckets, grpo_dist.weights.checksum, "
            "grpo_dist.weights.errors, grpo_dist.weights.nccl, grpo_dist.weights.object_store; "
            "print(sorted(m for m in sys.modules if m.startswith(('grpo_dist.rollout', 'vllm'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"
