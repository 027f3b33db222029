"""LoRA through peft: a frozen base in model.dtype, float32 adapters, merged weights for the engines.

    W' x = W x + (alpha / r) B A x          W frozen (model.dtype), A [r, in] and B [out, r] trained

- Precision: peft keeps the adapters in float32 (it casts bfloat16/float16 adapters up) and
  computes their path in float32; they are their own master weights, so only they get
  gradients and AdamW state. The base stays in model.dtype, exactly as an engine loads it.
- The reference policy pi_ref is the base itself, the adapter switched off for its pass
  (`BasePolicy`): no second copy of the model.
- The engines serve merged weights, W' = W + (alpha / r) B A computed in float32 and rounded
  to model.dtype once, under the base model's own parameter names: any engine loads them like
  a full checkpoint. B starts at 0, so version 0 is the base bit for bit.
- A saved policy holds the merged model in float32 (loadable by
  AutoModelForCausalLM.from_pretrained and vLLM) and the adapter in `adapter/` (peft format).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from peft.utils import load_peft_weights

from grpo_dist.learner.replicated import ReplicatedWeights
from grpo_dist.config.run import LoraConfig

ADAPTER = "adapter"  # the adapter's folder inside a saved policy
BASE_LAYER = ".base_layer"


def add_adapter(model: torch.nn.Module, lora: LoraConfig) -> PeftModel:
    """Wrap `model` with fresh LoRA adapters (B = 0); every base parameter is frozen."""
    config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=lora.target_modules, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class BasePolicy:
    """The base model of a peft model, called with its adapter switched off: pi_ref without a copy."""

    def __init__(self, model: PeftModel) -> None:
        self.model = model

    def __call__(self, **inputs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**inputs)


class LoraWeights(ReplicatedWeights):
    """The trainable part of a LoRA policy, with the interface of `precision.MasterWeights`."""

    def __init__(self, model: PeftModel, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        self.params = [p for p in model.parameters() if p.requires_grad]  # the float32 adapters
        self.base = model.get_base_model()
        self.layers = {name: module for name, module in self.base.named_modules() if isinstance(module, LoraLayer)}

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def collect_grads(self) -> None:
        """Nothing to move: the adapters are float32, their gradients are the master gradients."""

    def update_compute_copies(self) -> None:
        """Nothing to round: the forward pass reads the float32 adapters themselves."""

    @torch.no_grad()
    def merged_state_dict(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The base model's state dict, by its own names, with W + (alpha / r) B A in each adapted
        layer: computed in float32, then cast to `dtype` (other tensors keep their dtype)."""
        merged = {}
        for key, tensor in self.base.state_dict().items():
            if ".lora_" in key:
                continue
            module, _, leaf = key.rpartition(".")
            if module.endswith(BASE_LAYER):
                module = module.removesuffix(BASE_LAYER)
                key = f"{module}.{leaf}"
                if leaf == "weight" and module in self.layers:  # W' = W + (alpha / r) B A
                    tensor = (tensor.float() + self.layers[module].get_delta_weight("default").float()).to(dtype)
            merged[key] = tensor
        return merged

    def served_state_dict(self) -> dict[str, torch.Tensor]:
        """What the engines serve: the merged weights in model.dtype."""
        return self.merged_state_dict(self.dtype)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The merged policy in float32 (what a saved policy holds)."""
        return self.merged_state_dict(torch.float32)

    def save(self, directory: Path) -> None:
        """The merged model (float32, Hugging Face format) and the adapter in `directory/adapter`."""
        self.base.save_pretrained(directory, state_dict=self.state_dict())
        self.model.save_pretrained(directory / ADAPTER)

    def load(self, directory: Path) -> None:
        """Restore the adapter from `save`'s directory (the base is the one this learner loaded)."""
        weights = load_peft_weights(str(directory / ADAPTER), device=str(self.params[0].device))
        result = set_peft_model_state_dict(self.model, weights)
        if result.unexpected_keys:
            raise ValueError(f"the adapter in {directory / ADAPTER} does not fit this model: "
                             f"{result.unexpected_keys[:3]} ...")
