"""A reward model: a transformers sequence-classification model's score of prompt + completion."""

from __future__ import annotations

from typing import Literal

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as transformers_logging

from grpo_dist.config.schema import check_model_path, resolve_path
from grpo_dist.common.dtypes import DTYPES
from grpo_dist.reward.registry import batched


@batched
class RewardModel:
    """Loaded once per reward actor, on its GPU when it has one; scores batches of samples.

    The text scored is `prompt + completion`, truncated from the left to `max_length`
    tokens so that the end of the completion is always seen. The model must have a
    single output (num_labels=1): that logit is the reward.
    """

    def __init__(
        self,
        path: str,
        batch_size: int = 8,
        max_length: int = 2048,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
    ) -> None:
        transformers_logging.disable_progress_bar()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.max_length = max_length
        location = resolve_path(path)
        self.tokenizer = AutoTokenizer.from_pretrained(location, truncation_side="left", padding_side="right")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(location, dtype=DTYPES[dtype])
        if model.config.num_labels != 1:
            raise ValueError(f"reward model {path!r} has {model.config.num_labels} outputs; one is needed")
        model.config.pad_token_id = self.tokenizer.pad_token_id  # finds each sequence's last token
        self.model = model.to(self.device).eval()

    @staticmethod
    def check_options(path: str | None = None, batch_size: int = 1, max_length: int = 1, **_: object) -> None:
        """Checked in the config, before any actor starts (no download happens here)."""
        if path is None:
            raise ValueError("reward_model needs the option path (a local folder or a hub id)")
        check_model_path(path)
        if batch_size < 1 or max_length < 1:
            raise ValueError("reward_model needs batch_size >= 1 and max_length >= 1")

    @torch.inference_mode()
    def __call__(self, prompts: list[str], completions: list[str], **fields: list) -> list[float]:
        texts = [prompt + completion for prompt, completion in zip(prompts, completions)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size], padding=True, truncation=True,
                max_length=self.max_length, return_tensors="pt",
            ).to(self.device)
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            scores += logits[:, 0].float().tolist()
        return scores
