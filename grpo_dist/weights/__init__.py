"""Weight transport helpers: what a policy version is made of, and how to prove it arrived.

The controller moves each policy version with one `WeightSync` strategy, chosen by
`trainer.weight_sync` (`make_weight_sync`):

- `ObjectStoreSync` (here): the learner returns its state dict from a Ray method, which places
  it in the object store once per version; every rollout worker loads that one reference in place.
- `NcclSync` (weights_nccl.py): the learner broadcasts to every vLLM engine worker over a
  process group of their own (GPU engines).

Either way `push` returns the checksum each worker now serves, which the controller compares
with the learner's.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import ray
import torch


class WeightSyncError(RuntimeError):
    """A rollout worker serves weights other than the learner's: stale weights are an error."""


class WeightSync(Protocol):
    """How the controller moves the learner's weights to the rollout workers."""

    def setup(self) -> None:
        """Prepare the transport (once, after the actors start)."""
        ...

    def push(self, version: int) -> list[str | None]:
        """Send the learner's current weights as `version`; one served checksum per worker
        (None when verification is off)."""
        ...

    def close(self) -> None:
        """Release the transport; safe after a failed or missing `setup`."""
        ...


class ObjectStoreSync:
    """The state dict through the Ray object store: stored once, loaded by every worker."""

    def __init__(self, learner: Any, rollouts: list[Any], verify: bool = True) -> None:
        self.learner, self.rollouts, self.verify = learner, rollouts, verify

    def setup(self) -> None:
        pass

    def push(self, version: int) -> list[str | None]:
        weights = self.learner.export_weights.remote()  # an ObjectRef: stored once
        return ray.get([w.load_weights.remote(weights, version, self.verify) for w in self.rollouts])

    def close(self) -> None:
        pass


def make_weight_sync(config: Any, learner: Any, rollouts: list[Any]) -> WeightSync:
    """The strategy `trainer.weight_sync` asks for (auto resolved by `config.resolve_weight_sync`)."""
    from grpo_dist.config import resolve_weight_sync

    trainer = config.trainer
    if resolve_weight_sync(config) == "nccl":
        from grpo_dist.weights_nccl import NcclSync

        return NcclSync(learner, rollouts, tensor_parallel_size=config.rollout.vllm.tensor_parallel_size,
                        timeout_s=trainer.weight_sync_timeout_s, bucket_bytes=trainer.weight_sync_bucket_mb << 20,
                        verify=trainer.verify_weight_sync)
    return ObjectStoreSync(learner, rollouts, verify=trainer.verify_weight_sync)


def export_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the parameters and buffers, by Hugging Face name."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}


def state_checksum(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order: equal iff bit-identical."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
