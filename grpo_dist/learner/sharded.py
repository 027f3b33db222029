"""Sharded learner ranks on torch FSDP2 (`learner.sharding: fsdp`).

Each decoder layer and then the root are wrapped with `fully_shard`: every parameter becomes
a DTensor sharded on dim 0 over the K ranks. Those float32 shards are the master weights;
AdamW, built on them, keeps its state sharded alike. The mixed-precision policy casts the
gathered parameters to `model.dtype` for compute (the bfloat16 the engines serve, as the
compute copies of precision.py) and reduce-scatters gradients in float32 into the masters'
sharded `.grad`, summed over ranks rather than averaged: every loss is already divided by the
whole minibatch's D (distributed.py). A forward pass all-gathers layer by layer, a backward
pass reduce-scatters layer by layer, so every rank must run the same number of passes:
`ShardedRanks.pad` gives a rank with fewer micro-batches empty ones (a pass on one row of
the batch whose loss is multiplied by 0).

Weights leave without a whole copy anywhere: `gather(names)` all-gathers just those tensors
(in model.dtype; LoRA: merged), so publishing and checksumming walk the state bucket by
bucket, each rank holding one bucket's full tensors at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedTokenizerBase

from grpo_dist.learner import sharded_state
from grpo_dist.learner.distributed import DataParallel
from grpo_dist.learner.export import ShardedExport

BASE_LAYER = ".base_layer"


class ShardedRanks(DataParallel):
    """Data-parallel ranks whose gradients FSDP reduces in backward: no all-reduce of their own,
    and the same number of passes on every rank."""

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Nothing to do: backward reduce-scattered every gradient already (summed)."""

    def pad(self, parts: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """`parts` followed by empty micro-batches (None) up to the largest count of any rank."""
        count = torch.tensor([len(parts)], device=self.device)  # NCCL reduces device tensors only
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return [*parts, *[None] * (int(count) - len(parts))]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the classes transformers keeps whole (`_no_split_modules`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(base._no_split_modules or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"learner.sharding=fsdp: found no decoder layers in {type(base).__name__}")
    return layers


def shard(model: torch.nn.Module, dtype: torch.dtype | None, offload: str = "none",
          inference: bool = False) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (embeddings, final norm, a tied head);
    compute in `dtype` (None: the parameters' own), gradients reduced in float32 and summed.
    The root keeps its gathered parameters from forward to backward, unless for `inference`."""
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    offload_policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload == "all" else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy, offload_policy=offload_policy)
    fully_shard(model, mp_policy=policy, offload_policy=offload_policy, reshard_after_forward=inference or None)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # a sum over ranks: D is already global
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return model


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an all-gather of a DTensor; a plain tensor as it is)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class ShardedWeights(ShardedExport):
    """The `precision.PolicyWeights` of an FSDP2-sharded policy (float32 shards are the masters) on
    rank `rank`: export and sending in export.ShardedExport, checkpoints in sharded_state.py.

    With `lora_layers` (peft's LoraLayer modules by base-model name) the base is frozen and
    only the adapters train; the served weights are merged, W + (alpha / r) B A, as lora.py's.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, rank: int, offload: str = "none",
                 lora_layers: dict[str, torch.nn.Module] | None = None) -> None:
        self.model = shard(model, dtype, offload)
        self.dtype = dtype
        self.rank = rank
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.lora_layers = lora_layers
        self.base = model.get_base_model() if lora_layers is not None else model

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def collect_grads(self) -> None:
        """Nothing to move: backward left float32 gradients in the masters' shards."""

    def update_compute_copies(self) -> None:
        """Nothing to round: each forward casts the gathered masters to model.dtype."""

    # ------------------------------------------------------------ the served weights, bucket by bucket

    def served_names(self) -> dict[str, torch.Tensor]:
        """Every served name with a meta tensor of its served shape and dtype (no data, no collective)."""
        self.model.reshard()  # after a no-grad pass the root may still hold gathered parameters
        served = {}
        for key, tensor in self.base.state_dict().items():  # by base-model name: shards and buffers, no copy
            if ".lora_" in key:
                continue
            name = key.replace(BASE_LAYER + ".", ".")
            dtype = self.dtype if isinstance(tensor, DTensor) else tensor.dtype
            served[name] = torch.empty(tensor.shape, dtype=dtype, device="meta")
        return served

    @torch.no_grad()
    def gather(self, names: list[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """These served tensors whole, in `dtype` (default model.dtype; buffers keep theirs): a
        collective, every rank must call it with the same names."""
        self.model.reshard()
        dtype, sources, out = dtype or self.dtype, self.base.state_dict(), {}
        for name in names:
            module, _, leaf = name.rpartition(".")
            if self.lora_layers is None or module not in self.lora_layers:
                tensor = sources[name]
                out[name] = full(tensor.to(dtype)) if isinstance(tensor, DTensor) else tensor.detach()
                continue
            base = full(sources[f"{module}{BASE_LAYER}.{leaf}"]).float()
            if leaf == "weight":  # W' = W + (alpha / r) B A, in float32, rounded once
                layer = self.lora_layers[module]
                a, b = (full(sources[f"{module}.lora_{x}.default.weight"]).float() for x in "AB")
                base = base + (b @ a) * layer.scaling["default"]
            out[name] = base.to(dtype)
        return out

    # ------------------------------------------------------------ checkpoints (every rank calls them)

    def save_state(self, directory: Path, tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
                   generator: torch.Generator, counters: dict[str, Any]) -> None:
        """Every rank writes its shards (sharded_state.py)."""
        sharded_state.save_state(directory, self, tokenizer, optimizer, scheduler, reference, generator, counters,
                                 self.rank)

    def load_state(self, directory: Path, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
                   generator: torch.Generator) -> dict[str, Any]:
        return sharded_state.load_state(directory, self, optimizer, scheduler, reference, generator)

    def write_policy(self, tokenizer: PreTrainedTokenizerBase, target: Path) -> Path:
        """Every rank gathers, rank 0 writes."""
        return sharded_state.write_policy(self, tokenizer, target, self.rank)

    def refresh_reference(self, reference: torch.nn.Module) -> None:
        """pi_ref (sharded alike) becomes the policy shard by shard, rounded to model.dtype."""
        copy_shards(reference, self.model)


@torch.no_grad()
def copy_shards(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """Every parameter of `source` into `target`'s, shard by shard (both sharded alike; no collective)."""
    for into, value in zip(target.parameters(), source.parameters(), strict=True):
        into.to_local().copy_(value.to_local())
