"""The interface every generation backend implements (transformers, vLLM): sampling, and the
two ways new weights arrive (a state dict through the object store, buckets over a weight group)."""

from __future__ import annotations

from typing import Protocol

import torch

from grpo_dist.common.types import Completion, SamplingSettings
from grpo_dist.weights.buckets import Bucket


class GenerationEngine(Protocol):
    """A model that samples completions and takes new weights in place."""

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingSettings, seeds: list[int]
    ) -> list[list[Completion]]:
        """Sample `sampling.n` completions for each prompt; one inner list per prompt.

        Completion j of prompt i draws from a stream seeded by
        `seeding.completion_seed(seeds[i], j)`, whatever else is in the call.
        """
        ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Replace the served weights with `state_dict` (Hugging Face parameter names)."""
        ...

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, timeout_s: float,
                          backend: str = "nccl") -> None:
        """Join the learner's weight group (weights/nccl.py: nccl on a GPU, gloo the CPU stand-in);
        this engine's worker w is rank `rank_offset + w` of `world_size`."""
        ...

    def receive_weights(self, buckets: list[Bucket], timeout_s: float | None = None) -> None:
        """Take the version the learner broadcasts over the weight group, bucket by bucket, in place."""
        ...

    def leave_weight_group(self) -> None:
        """Drop this engine's end of the weight group (before a new one is formed)."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights the engine serves now, by Hugging Face parameter name."""
        ...

    def checksum(self) -> str:
        """`weights.state_checksum` of `state_dict()`, computed where the weights live."""
        ...
