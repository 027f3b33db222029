"""RolloutWorker: one generation engine; samples groups and takes new weights in place."""

from __future__ import annotations

from typing import Any

import torch

from grpo_dist.config import ModelConfig, RolloutConfig
from grpo_dist.rollout.engine import GenerationEngine
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.types import Group, SamplingSettings
from grpo_dist.weights import state_checksum


def build_engine(model: ModelConfig, rollout: RolloutConfig) -> GenerationEngine:
    device = "cuda" if rollout.num_gpus > 0 and torch.cuda.is_available() else "cpu"
    return HFEngine(model.path, dtype=model.dtype, device=device)


class RolloutWorker:
    """Runs as a Ray actor (see trainer.py); plain class so that it can be used directly."""

    def __init__(self, model: ModelConfig, rollout: RolloutConfig, seed: int) -> None:
        torch.set_num_threads(rollout.threads)
        self.engine = build_engine(model, rollout)
        self.tokenizer = self.engine.tokenizer
        self.seed = seed
        self.calls = 0
        self.version = 0

    def generate(self, rows: list[dict[str, Any]], prompts: list[str], sampling: SamplingSettings) -> list[Group]:
        """One group of `sampling.n` completions per prompt, tagged with the policy version."""
        prompt_ids = [self.tokenizer(prompt)["input_ids"] for prompt in prompts]
        if sampling.seed is None:  # a fresh, reproducible stream per call
            sampling = SamplingSettings(**{**sampling.__dict__, "seed": self.seed * 100_003 + self.calls})
        self.calls += 1
        completions = self.engine.generate(prompt_ids, sampling)
        return [
            Group(row=row, prompt=prompt, prompt_ids=ids, completions=group, policy_version=self.version)
            for row, prompt, ids, group in zip(rows, prompts, prompt_ids, completions)
        ]

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int, verify: bool = True) -> str | None:
        """Load a new policy version in place; returns the checksum of what is now served."""
        self.engine.load_weights(state_dict)
        self.version = version
        return self.checksum() if verify else None

    def checksum(self) -> str:
        return state_checksum(self.engine.state_dict())

    def policy_version(self) -> int:
        return self.version
