"""Checkpoints and the saved policy of sharded ranks (learner.sharding=fsdp).

    DIRECTORY/shards/        torch.distributed.checkpoint: every rank writes its own shards of
                             the float32 masters, AdamW's state and a refreshed reference; rank 0
                             the metadata. Loading reshards to any number of ranks.
    DIRECTORY/policy/        the consolidated policy in Hugging Face format (float32, safetensors
                             files of one bucket each and their index; from_pretrained loads it)
    DIRECTORY/scheduler.pt, rng.pt, learner.json   as learner/state.py's, written by rank 0

No rank holds the whole policy: the Hugging Face files are gathered and written a bucket at a
time. Every function here is a collective: every rank calls it. Atomicity is the caller's
for checkpoints (controller/checkpoints.py); `write_policy` makes its own, as state.py's.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from transformers import PreTrainedTokenizerBase

from grpo_dist.common.atomic import replace_folder
from grpo_dist.learner.state import COUNTERS, POLICY, RNG, SCHEDULER, save_tensors
from grpo_dist.weights.buckets import plan_buckets

SHARDS = "shards"
FILE_BYTES = 2 << 30  # the largest safetensors file of a saved policy (and the most any rank gathers)


class Shards(Protocol):
    """What this module reads of sharded.ShardedWeights: the sharded model and its gathered tensors."""

    model: torch.nn.Module
    base: torch.nn.Module
    dtype: torch.dtype

    def served_names(self) -> dict[str, torch.Tensor]: ...
    def gather(self, names: list[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]: ...


def save_policy(weights: Shards, tokenizer: PreTrainedTokenizerBase, directory: Path, rank: int,
                file_bytes: int = FILE_BYTES) -> None:
    """The policy's float32 masters (LoRA: merged) in Hugging Face's sharded safetensors layout,
    written by rank 0 one gathered bucket at a time; config.json keeps the serving dtype."""
    plan = plan_buckets({name: meta.to(torch.float32) if meta.is_floating_point() else meta
                         for name, meta in weights.served_names().items()}, file_bytes)
    weight_map = {}
    for index, bucket in enumerate(plan, start=1):
        tensors = weights.gather([slot.name for slot in bucket.slots], torch.float32)
        file = f"model-{index:05d}-of-{len(plan):05d}.safetensors"
        if rank == 0:
            save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, directory / file,
                      metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, file))
    if rank == 0:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                           indent=2) + "\n")
        config = weights.base.config
        config.dtype = str(weights.dtype).removeprefix("torch.")  # the serving dtype, as precision.py saves it
        config.save_pretrained(directory)
        tokenizer.save_pretrained(directory)


def write_policy(weights: Shards, tokenizer: PreTrainedTokenizerBase, target: Path, rank: int) -> Path:
    """`save_policy` into a hidden sibling of `target` (rank 0's), then renamed over it atomically."""
    staging = None
    if rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_policy(weights, tokenizer, staging or target, rank)
        if rank == 0:
            replace_folder(staging, target)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _state(weights: Shards, optimizer: torch.optim.Optimizer,
           reference: torch.nn.Module | None) -> dict[str, Any]:
    """What DCP saves and loads in place: sharded model and optimizer state (and a refreshed reference)."""
    model, optim = get_state_dict(weights.model, optimizer)
    state = {"model": model, "optimizer": optim}
    if reference is not None:
        state["reference"] = reference.state_dict()
    return state


def save_state(directory: Path, weights: Shards, tokenizer: PreTrainedTokenizerBase,
               optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
               reference: torch.nn.Module | None, generator: torch.Generator, counters: dict[str, Any],
               rank: int) -> None:
    """The learner's share of a checkpoint: each rank its shards; rank 0 the rest (see the module doc)."""
    directory.mkdir(parents=True, exist_ok=True)
    dcp.save(_state(weights, optimizer, reference), checkpoint_id=str(directory / SHARDS))
    (directory / POLICY).mkdir(exist_ok=True)
    save_policy(weights, tokenizer, directory / POLICY, rank)
    if rank == 0:
        save_tensors(scheduler.state_dict(), directory / SCHEDULER)
        save_tensors({"torch": torch.get_rng_state(), "minibatch": generator.get_state()}, directory / RNG)
        (directory / COUNTERS).write_text(json.dumps(counters, indent=2) + "\n")
    dist.barrier()  # every rank's shards are on disk before the caller seals the checkpoint


def load_state(directory: Path, weights: Shards, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
               generator: torch.Generator) -> dict[str, Any]:
    """Restore `save_state`'s directory, written by any number of ranks, into these; returns the counters.

    `reference`: the refreshed reference (algo.ref_refresh_every), saved and loaded with the shards.
    """
    if not (directory / SHARDS).is_dir():
        raise FileNotFoundError(f"learner state in {directory} has no {SHARDS}/: it was not saved by sharded "
                                "ranks (learner.sharding must be the checkpoint's)")
    state = _state(weights, optimizer, reference)
    dcp.load(state, checkpoint_id=str(directory / SHARDS))
    set_state_dict(weights.model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if "reference" in state:
        reference.load_state_dict(state["reference"])
    scheduler.load_state_dict(torch.load(directory / SCHEDULER, weights_only=True))
    rng = torch.load(directory / RNG, weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["minibatch"])
    return json.loads((directory / COUNTERS).read_text())
