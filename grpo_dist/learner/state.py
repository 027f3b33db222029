"""The learner's share of a checkpoint, and the policy in Hugging Face format.

    DIRECTORY/policy/        config.json, model.safetensors (the float32 masters), tokenizer:
                             loadable by AutoModelForCausalLM.from_pretrained and by vLLM
    DIRECTORY/optimizer.pt   AdamW's state (float32)
    DIRECTORY/rng.pt         torch's RNG states (CPU, and CUDA where used) and the minibatch generator
    DIRECTORY/learner.json   the policy version and step counters

Saving then loading into a fresh learner gives bit-identical next steps. Atomicity is the
caller's (checkpoint.py writes into a staging directory and renames it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from grpo_dist.learner.precision import MasterWeights
from grpo_dist.rollout.hf_engine import load_causal_lm

POLICY, OPTIMIZER, RNG, COUNTERS = "policy", "optimizer.pt", "rng.pt", "learner.json"


def save_policy(weights: MasterWeights, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """The policy with its float32 masters, and the tokenizer, in Hugging Face format."""
    weights.model.save_pretrained(directory, state_dict=weights.state_dict())
    tokenizer.save_pretrained(directory)


def save_state(directory: Path, weights: MasterWeights, tokenizer: PreTrainedTokenizerBase,
               optimizer: torch.optim.Optimizer, generator: torch.Generator, counters: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_policy(weights, tokenizer, directory / POLICY)
    torch.save(optimizer.state_dict(), directory / OPTIMIZER)
    rng = {"torch": torch.get_rng_state(), "minibatch": generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, directory / RNG)
    (directory / COUNTERS).write_text(json.dumps(counters, indent=2) + "\n")


def load_state(directory: Path, weights: MasterWeights, optimizer: torch.optim.Optimizer,
               generator: torch.Generator) -> dict[str, Any]:
    """Restore what `save_state` wrote into a learner built from the same config; returns the counters."""
    missing = [name for name in (POLICY, OPTIMIZER, RNG, COUNTERS) if not (directory / name).exists()]
    if missing:
        raise FileNotFoundError(f"learner state in {directory} lacks {missing}")
    weights.load_state_dict(load_causal_lm(str(directory / POLICY), "float32").state_dict())
    optimizer.load_state_dict(torch.load(directory / OPTIMIZER, weights_only=True))
    rng = torch.load(directory / RNG, weights_only=True)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["minibatch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((directory / COUNTERS).read_text())
