"""Methods mixed into vLLM's worker class through `worker_extension_cls`.

vLLM imports this module inside its worker processes and adds `GRPOWorkerExtension` to the
worker's bases, so `self` below is the vLLM worker. The engine calls these methods through
`LLM.collective_rpc`. Their names carry a `grpo_` prefix: the CPU worker already defines
`update_weights`, and an extension method may not shadow a worker method.

Weights travel as a dict of tensors when the worker runs in the caller's process, and as
safetensors bytes when it runs in another process (tensors do not pickle there).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)

from grpo_dist.weights import nccl
from grpo_dist.weights.buckets import Bucket
from grpo_dist.weights.checksum import state_checksum

Weights = dict[str, torch.Tensor] | bytes


class GRPOWorkerExtension:
    """Weight exchange between the GRPO learner and a vLLM worker."""

    def grpo_reload_weights(self, weights: Weights) -> None:
        """Load Hugging Face-named weights in place (vLLM fuses q/k/v and gate/up itself)."""
        tensors = load_safetensors(weights) if isinstance(weights, bytes) else weights
        tensors = _with_tied_aliases(self.model_runner.get_model(), tensors)
        self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)

    def grpo_state_dict(self, as_bytes: bool = False) -> Weights:
        """The served weights by Hugging Face name: fused matrices split, vocab padding cut."""
        model = self.model_runner.get_model()
        packed = getattr(model, "packed_modules_mapping", {})
        tensors: dict[str, torch.Tensor] = {}
        for module_name, module in model.named_modules():
            for param_name, param in module.named_parameters(recurse=False):
                served = _in_model_dtype(_served_tensor(module, param_name, param), self.model_config.dtype)
                parts = _split_packed(module_name, param_name, module, served, packed)
                tensors.update({name: _fresh(part) for name, part in parts.items()})
        return save_safetensors(tensors) if as_bytes else tensors

    def grpo_join_weight_group(
        self,
        host: str,
        port: int,
        rank_offset: int,
        world_size: int,
        timeout_s: float,
        backend: nccl.Backend = "nccl",
    ) -> None:
        """Join the learner's weight-update group as rank rank_offset + this worker's rank."""
        self.grpo_weight_group = nccl.communicator(
            backend, host, port, rank_offset + self.rank, world_size, self.device, timeout_s
        )

    def grpo_leave_weight_group(self) -> None:
        self.grpo_weight_group = None

    def grpo_receive_weights(self, buckets: list[Bucket]) -> None:
        """Load the buckets the learner broadcasts, one bucket in memory at a time.

        The learner sends its whole state dict, tied names included (see _with_tied_aliases).
        """
        weights = nccl.receive(self.grpo_weight_group, buckets, self.device)
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)

    def grpo_checksum(self) -> str:
        """`state_checksum` of the served weights, so that only a hex string leaves the worker."""
        return state_checksum(self.grpo_state_dict())


def _with_tied_aliases(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Name a tied parameter under all its names (lm_head.weight for embed_tokens.weight).

    vLLM reprocesses a layer only when its own name is loaded: a tied lm_head left out
    would keep computing logits from a packed copy of the old embedding.
    """
    names_of: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of[id(param)].append(name)
    aliases = {}
    for names in names_of.values():
        given = [name for name in names if name in tensors]
        if given:
            aliases.update({name: tensors[given[0]] for name in names if name not in tensors})
    return {**tensors, **aliases}


def _served_tensor(module: torch.nn.Module, param_name: str, param: torch.Tensor) -> torch.Tensor:
    """The tensor a module computes with, read back from the CPU kernel where there is one.

    On the CPU, vLLM hands linear and LM-head weights to a packed GEMM kernel (oneDNN) and
    empties linear `weight`s; multiplying the identity through that kernel returns W^T
    exactly, and also shows a stale packed copy that `weight` itself would hide.
    """
    if param_name == "weight" and _uses_cpu_gemm(module):
        in_features = param.shape[1] if param.numel() else module.input_size
        eye = torch.eye(in_features, dtype=param.dtype, device=param.device)
        param = module.cpu_linear(eye, param, None).t()
    org_vocab_size = getattr(module, "org_vocab_size", None)
    if org_vocab_size is not None:
        param = param[:org_vocab_size]
    return param.detach()


def _in_model_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float32 tensor of a bf16/fp16 model in the model's dtype, when that changes no value.

    On CPUs with AMX, vLLM hands bf16 linears of up to 1 MiB to sgl-kernel's
    weight_packed_linear and turns their biases into float32, which the kernel adds to its
    float32 accumulator (vllm/model_executor/layers/utils.py, dispatch_cpu_unquantized_gemm).
    Loaded from the learner's bf16 tensors they hold bf16 values: those compare equal here.
    A value bf16 cannot hold stays float32 and fails the checksum, as it should: the kernel
    computes with something the learner does not have.
    """
    if tensor.dtype != torch.float32 or dtype not in (torch.bfloat16, torch.float16):
        return tensor
    narrowed = tensor.to(dtype)
    return narrowed if torch.equal(narrowed.float(), tensor) else tensor


def _uses_cpu_gemm(module: torch.nn.Module) -> bool:
    """Whether the module's weight is applied through the CPU backend's GEMM kernel."""
    is_lookup_table = isinstance(module, VocabParallelEmbedding) and not isinstance(
        module, ParallelLMHead
    )
    return hasattr(module, "cpu_linear") and not is_lookup_table


def _split_packed(
    module_name: str,
    param_name: str,
    module: torch.nn.Module,
    tensor: torch.Tensor,
    packed: dict[str, list[str]],
) -> dict[str, torch.Tensor]:
    """Split a fused parameter (qkv_proj, gate_up_proj) back into its Hugging Face parts."""
    prefix, _, leaf = module_name.rpartition(".")
    parts = packed.get(leaf)
    if not parts or param_name not in ("weight", "bias"):
        return {f"{module_name}.{param_name}": tensor}
    chunks = torch.split(tensor, list(module.output_sizes), dim=0)
    return {
        f"{prefix}.{part}.{param_name}": chunk for part, chunk in zip(parts, chunks, strict=True)
    }


def _fresh(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy that shares no storage (safetensors refuses views and strides)."""
    return tensor.clone(memory_format=torch.contiguous_format)
