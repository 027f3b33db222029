"""Loading the policy's tokenizer and causal LM (model.path): one way for the rollout
engines, the learner and data.py, so that all of them read the same checkpoint the same way."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from grpo_dist.config.schema import resolve_path
from grpo_dist.common.dtypes import DTYPES


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a local folder, hub id or builtin: path; without a pad token, EOS pads."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_path(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str, device: str = "cpu") -> torch.nn.Module:
    """A causal LM from a local folder or hub id, in eval mode."""
    transformers_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(resolve_path(path), dtype=DTYPES[dtype])
    return model.to(device).eval()

