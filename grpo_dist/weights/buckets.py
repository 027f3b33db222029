"""Bucket planning: a state dict laid out as a few flat byte buffers ("buckets").

Each policy version travels over the weight group (nccl.py) as buckets of at most
`bucket_bytes`, one broadcast each, so the number of collectives stays small while the extra
memory on either side is one bucket. Both sides must agree on the plan: the learner makes it
with `plan_buckets` and the controller hands it to the engines. Plain torch, no transport.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALIGN = 256  # bytes; every tensor starts at a multiple of this inside its bucket
DEFAULT_BUCKET_BYTES = 512 << 20


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lies inside a bucket."""

    name: str
    dtype: str  # e.g. "bfloat16", a torch dtype attribute name (pickles everywhere)
    shape: tuple[int, ...]
    offset: int  # bytes from the bucket's start

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True)
class Bucket:
    slots: tuple[TensorSlot, ...]
    nbytes: int


def plan_buckets(tensors: dict[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Group tensors, in order, into buckets of at most `bucket_bytes` (a larger tensor goes alone)."""
    buckets: list[Bucket] = []
    slots: list[TensorSlot] = []
    used = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        start = _aligned(used)
        if slots and start + size > bucket_bytes:
            buckets.append(Bucket(tuple(slots), used))
            slots, start = [], 0
        slots.append(TensorSlot(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), start))
        used = start + size
    if slots:
        buckets.append(Bucket(tuple(slots), used))
    return buckets


def pack(tensors: dict[str, torch.Tensor], bucket: Bucket, device: torch.device | str) -> torch.Tensor:
    """One flat uint8 buffer on `device` holding the bucket's tensors at their offsets."""
    buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
    for slot in bucket.slots:
        source = tensors[slot.name].detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[slot.offset : slot.offset + slot.nbytes].copy_(source)
    return buffer


def unpack(buffer: torch.Tensor, bucket: Bucket) -> dict[str, torch.Tensor]:
    """The bucket's tensors as views into `buffer` (no copy)."""
    return {
        slot.name: buffer[slot.offset : slot.offset + slot.nbytes].view(getattr(torch, slot.dtype)).view(slot.shape)
        for slot in bucket.slots
    }


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
