"""What a policy version is made of on the wire, and a checksum that proves two copies equal."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def export_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies of a model's parameters and buffers, by Hugging Face name."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state_dict.items()}


def state_checksum(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order: equal iff bit-identical."""
    return stream_checksum((name, state_dict[name]) for name in sorted(state_dict))


def stream_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """`state_checksum` of (name, tensor) pairs that arrive one at a time, in name order (a sharded
    learner gathers each tensor just before it is hashed)."""
    digest = hashlib.sha256()
    for name, tensor in named:
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
