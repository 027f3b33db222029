"""Mixed precision: the policy computes (and is served) in `model.dtype`; AdamW updates fp32 masters.

The recipe is Micikevicius et al. (2018): the model's parameters are compute copies in
bfloat16 (or float16) of float32 master weights. Forward and backward run in the compute
dtype; after each micro-batch its gradients are added into float32 master gradients;
clipping, the gradient norm and AdamW (whose state is float32) work on the masters; the
updated masters are then rounded into the compute copies. An AdamW update of 1e-6 on a
weight of 0.02 survives in float32, where bfloat16 (spacing about 1.2e-4 there) would round
it away.

Why compute copies rather than a float32 model under bf16 autocast: the model the learner
runs forward is then exactly the model the engines serve (the same bfloat16 tensors, which
`export_weights` sends and `checksum` hashes), so pi_old from the learner matches the
sampler's logprobs as closely as the engines' kernels allow, and activations stay in the
compute dtype throughout (autocast keeps the residual stream in float32, about twice the
activation memory). The price: 4 (master) + 2 (copy) + 2 (its gradient, freed after each
micro-batch) + 4 (master gradient) + 8 (AdamW) = 20 bytes per parameter, against 16 for a
float32 model.

With `model.dtype=float32` the masters are the model's own parameters and nothing is copied.
With `learner.lora` only the adapters train, in float32 (lora.py: `LoraWeights`, the same
interface as `MasterWeights`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from grpo_dist.common.dtypes import DTYPES
from grpo_dist.learner.export import WeightGroup
from grpo_dist.learner.replicated import ReplicatedWeights
from grpo_dist.common.models import load_causal_lm
from grpo_dist.config.run import LoraConfig
from grpo_dist.weights.buckets import Bucket


class PolicyWeights(Protocol):
    """The policy's trainable weights as the learner sees them, a strategy that holds all that differs
    between a policy each rank holds whole (`MasterWeights`, `lora.LoraWeights`) and a sharded one
    (`sharded.ShardedWeights`): the update's precision, export, checksum, sending, checkpoints."""

    model: torch.nn.Module  # what computes pi_theta
    params: list[torch.nn.Parameter]  # float32: what AdamW steps, gradients are reduced on

    def zero_grad(self) -> None: ...
    def collect_grads(self) -> None: ...
    def update_compute_copies(self) -> None: ...
    def export(self, bucket_bytes: int) -> dict[str, torch.Tensor] | list[Any] | None: ...
    def checksum(self) -> str: ...
    def weight_plan(self, bucket_bytes: int) -> list[Bucket]: ...
    def send(self, group: WeightGroup, buckets: list[Bucket]) -> None: ...
    def refresh_reference(self, reference: torch.nn.Module) -> None: ...
    def save_state(self, directory: Path, tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
                   generator: torch.Generator, counters: dict[str, Any]) -> None: ...
    def load_state(self, directory: Path, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, reference: torch.nn.Module | None,
                   generator: torch.Generator) -> dict[str, Any]: ...
    def write_policy(self, tokenizer: PreTrainedTokenizerBase, target: Path) -> Path: ...


class MasterWeights(ReplicatedWeights):
    """float32 masters of `model`'s parameters, which are cast to `dtype` here.

    Only parameters are cast: buffers (a rotary `inv_freq`) stay as the loader leaves them,
    as with `from_pretrained(dtype=...)`, so the compute model equals an engine's bit for bit.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        compute = [p for p in model.parameters() if p.requires_grad]
        self.separate = dtype != torch.float32
        if self.separate:
            self.params = [torch.nn.Parameter(p.detach().float().clone()) for p in compute]
            for param in compute:
                param.data = param.data.to(dtype)
        else:
            self.params = compute
        self._pairs = list(zip(compute, self.params))

    def zero_grad(self) -> None:
        for compute, master in self._pairs:
            compute.grad = master.grad = None

    def collect_grads(self) -> None:
        """After a micro-batch's backward: add its gradients into the float32 master gradients."""
        if not self.separate:
            return  # backward accumulates into the float32 parameters themselves
        for compute, master in self._pairs:
            if compute.grad is None:
                continue
            if master.grad is None:
                master.grad = compute.grad.float()
            else:
                master.grad.add_(compute.grad)
            compute.grad = None

    @torch.no_grad()
    def update_compute_copies(self) -> None:
        """After an optimizer step: round the masters into the compute copies."""
        if self.separate:
            for compute, master in self._pairs:
                compute.copy_(master)

    def served_state_dict(self) -> dict[str, torch.Tensor]:
        """What the engines serve: the compute copies (model.dtype), by Hugging Face name."""
        return self.model.state_dict()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with the float32 masters in place of the compute copies."""
        master_of = {id(compute): master.detach() for compute, master in self._pairs}
        named = dict(self.model.named_parameters(remove_duplicate=False))
        return {name: master_of.get(id(named[name]), tensor) if name in named else tensor
                for name, tensor in self.model.state_dict().items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Set the masters from a float32 state dict (Hugging Face names), then the compute copies."""
        names = {id(param): name for name, param in self.model.named_parameters()}
        for compute, master in self._pairs:
            master.copy_(state[names[id(compute)]])
        self.update_compute_copies()

    def save(self, directory: Path) -> None:
        """The policy in Hugging Face format, holding the float32 masters."""
        self.model.save_pretrained(directory, state_dict=self.state_dict())

    def load(self, directory: Path) -> None:
        """Set the masters (and copies) from `save`'s directory."""
        self.load_state_dict(load_causal_lm(str(directory), "float32").state_dict())


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off, also in train mode: pi_old must be the sampler's deterministic policy."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def load_policy(path: str, dtype: str, device: str, gradient_checkpointing: bool = False,
                lora: LoraConfig | None = None) -> PolicyWeights:
    """The trainable policy: float32 masters, compute copies in `dtype`, dropout off, train mode.

    With `lora`: the base in `dtype`, frozen, with float32 adapters (lora.py).
    """
    model = load_causal_lm(path, "float32" if lora is None else dtype, device)
    disable_dropout(model)
    model.config.use_cache = False
    if gradient_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise ValueError(f"learner.gradient_checkpointing: {type(model).__name__} does not support it")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # transformers checkpoints activations only in train mode; dropout is off
    if lora is not None:
        from grpo_dist.learner.lora import LoraWeights, add_adapter  # imports peft: only when used

        return LoraWeights(add_adapter(model, lora), DTYPES[dtype])
    return MasterWeights(model, DTYPES[dtype])


def load_reference(path: str, dtype: str, device: str) -> torch.nn.Module:
    """The frozen reference policy pi_ref, in the compute dtype."""
    return load_causal_lm(path, dtype, device).requires_grad_(False)
