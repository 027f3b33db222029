"""The interface every generation backend implements (transformers, vLLM)."""

from __future__ import annotations

from typing import Protocol

import torch

from grpo_dist.types import Completion, SamplingSettings


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

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights the engine serves now, by Hugging Face parameter name."""
        ...

    def checksum(self) -> str:
        """`weights.state_checksum` of `state_dict()`, computed where the weights live."""
        ...
