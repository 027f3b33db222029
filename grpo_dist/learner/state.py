"""The learner's share of a checkpoint, and the policy in Hugging Face format.

    DIRECTORY/policy/        config.json, model.safetensors (the float32 masters), tokenizer:
                             loadable by AutoModelForCausalLM.from_pretrained and by vLLM;
                             with LoRA the merged model, and the adapter in policy/adapter/
    DIRECTORY/optimizer.pt   AdamW's state (float32)
    DIRECTORY/scheduler.pt   the learning-rate schedule's position
    DIRECTORY/reference/     the reference model, only when algo.ref_refresh_every replaces it
    DIRECTORY/rng.pt         torch's RNG states (CPU, and CUDA where used) and the minibatch generator
    DIRECTORY/learner.json   the policy version and step counters

Saving then loading into a fresh learner gives bit-identical next steps. Atomicity is the
caller's (controller/checkpoints.py writes into a staging directory and renames it); `write_policy`
(Learner.save) makes its own.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from grpo_dist.common.atomic import replace_folder
from grpo_dist.common.models import load_causal_lm

POLICY, OPTIMIZER, SCHEDULER, REFERENCE = "policy", "optimizer.pt", "scheduler.pt", "reference"
RNG, COUNTERS = "rng.pt", "learner.json"


class SavedPolicy(Protocol):
    """What this module reads of the weights (replicated.ReplicatedWeights): their own Hugging Face files."""

    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...


def save_policy(weights: SavedPolicy, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """The policy with its float32 masters (or merged LoRA and adapter), and the tokenizer, in Hugging Face format."""
    weights.save(directory)
    tokenizer.save_pretrained(directory)


def write_policy(weights: SavedPolicy, tokenizer: PreTrainedTokenizerBase, target: Path) -> Path:
    """`save_policy` to `target`, replacing a folder there atomically: the policy is written into
    a hidden sibling first, so a save that fails leaves the old folder as it was (and no sibling)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_policy(weights, tokenizer, staging)
        replace_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # renamed away unless something failed
    return target


def save_state(directory: Path, weights: SavedPolicy, tokenizer: PreTrainedTokenizerBase,
               optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
               reference: torch.nn.Module | None, generator: torch.Generator, counters: dict[str, Any]) -> None:
    """`reference`: the reference model when it is no longer model.path's (refreshed), else None."""
    directory.mkdir(parents=True, exist_ok=True)
    save_policy(weights, tokenizer, directory / POLICY)
    save_tensors(optimizer.state_dict(), directory / OPTIMIZER)
    save_tensors(scheduler.state_dict(), directory / SCHEDULER)
    if reference is not None:
        reference.save_pretrained(directory / REFERENCE)
    rng = {"torch": torch.get_rng_state(), "minibatch": generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    save_tensors(rng, directory / RNG)
    (directory / COUNTERS).write_text(json.dumps(counters, indent=2) + "\n")


def save_tensors(state: Any, path: Path) -> None:
    """torch.save through a Python file, so that a write that fails raises the OSError that failed
    it ("[Errno 28] No space left on device"): torch's own writer says only "unexpected pos"."""
    with path.open("wb") as handle:
        try:
            torch.save(state, handle)
        except RuntimeError as exc:
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise


def load_state(directory: Path, weights: SavedPolicy, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
               generator: torch.Generator) -> dict[str, Any]:
    """Restore what `save_state` wrote into a learner built from the same config; returns the counters.

    `reference`: the learner's reference model, restored from `reference/` when the state has one.
    """
    missing = [name for name in (POLICY, OPTIMIZER, SCHEDULER, RNG, COUNTERS) if not (directory / name).exists()]
    if missing:
        raise FileNotFoundError(f"learner state in {directory} lacks {missing}")
    weights.load(directory / POLICY)
    optimizer.load_state_dict(torch.load(directory / OPTIMIZER, weights_only=True))
    scheduler.load_state_dict(torch.load(directory / SCHEDULER, weights_only=True))
    if reference is not None and (directory / REFERENCE).exists():
        dtype = next(reference.parameters()).dtype
        reference.load_state_dict(load_causal_lm(str(directory / REFERENCE), str(dtype).removeprefix("torch.")
                                                 ).state_dict())
    rng = torch.load(directory / RNG, weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["minibatch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((directory / COUNTERS).read_text())
