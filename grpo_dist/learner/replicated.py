"""What the weights of a policy each rank holds whole do alike (precision.MasterWeights, lora.LoraWeights).

Export, checksum and sending read one served state dict (export.WholeExport); a checkpoint and a
saved policy are state.py's files, written by this process alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from grpo_dist.learner import state
from grpo_dist.learner.export import WholeExport


class ReplicatedWeights(WholeExport):
    """The weight strategy of one rank or replicated data-parallel ranks; subclasses hold the tensors."""

    def save(self, directory: Path) -> None:
        raise NotImplementedError

    def load(self, directory: Path) -> None:
        raise NotImplementedError

    def save_state(self, directory: Path, tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
                   generator: torch.Generator, counters: dict[str, Any]) -> None:
        state.save_state(directory, self, tokenizer, optimizer, scheduler, reference, generator, counters)

    def load_state(self, directory: Path, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
                   generator: torch.Generator) -> dict[str, Any]:
        return state.load_state(directory, self, optimizer, scheduler, reference, generator)

    def write_policy(self, tokenizer: PreTrainedTokenizerBase, target: Path) -> Path:
        return state.write_policy(self, tokenizer, target)

    def refresh_reference(self, reference: torch.nn.Module) -> None:
        """pi_ref becomes the served weights, copied."""
        reference.load_state_dict(self.served_state_dict())
