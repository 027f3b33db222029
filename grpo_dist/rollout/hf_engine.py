"""Generation with plain transformers: the CPU fallback and the reference backend."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from grpo_dist.config import resolve_path
from grpo_dist.dtypes import DTYPES
from grpo_dist.types import Completion, SamplingSettings
from grpo_dist.weights import nccl
from grpo_dist.weights.checksum import state_checksum


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(resolve_path(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str, device: str = "cpu") -> torch.nn.Module:
    """A causal LM from a local folder or hub id, in eval mode."""
    transformers_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(resolve_path(path), dtype=DTYPES[dtype])
    return model.to(device).eval()


class HFEngine:
    """Batched sampling with `model.generate`, returning the sampler's logprobs."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu") -> None:
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_causal_lm(model_path, dtype, device)
        self.device = device

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings,
                 seeds: list[int]) -> list[list[Completion]]:
        torch.manual_seed(seeds[0])  # interim: one stream per call until the per-completion sampler lands
        input_ids, attention_mask = self._left_padded(prompt_ids)
        greedy = sampling.temperature == 0
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else 0,  # no hidden top-k: sample from the full distribution
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=sampling.n,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        new_tokens = out.sequences[:, input_ids.shape[1] :]
        # `scores` are the logits after temperature and top-p: the distribution sampled from
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(dim=-1)
        token_logprobs = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        completions = [self._completion(new_tokens[i], token_logprobs[i]) for i in range(new_tokens.shape[0])]
        return [completions[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompt_ids))]

    def _left_padded(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(ids) for ids in prompt_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompt_ids], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=self.device)
        return input_ids, mask

    def _completion(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> Completion:
        ids = tokens.tolist()
        eos = self.tokenizer.eos_token_id
        finish_reason = "length"
        if eos in ids:
            ids = ids[: ids.index(eos) + 1]
            finish_reason = "stop"
        return Completion(
            token_ids=ids,
            logprobs=logprobs[: len(ids)].tolist(),
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish_reason,
        )

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict, strict=True)

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, timeout_s: float,
                          backend: str = "nccl") -> None:
        """Join the learner's weight group as rank `rank_offset` (weights/nccl.py)."""
        self.weight_group = nccl.communicator(backend, host, port, rank_offset, world_size,
                                                      self.device, timeout_s)

    @torch.no_grad()
    def receive_weights(self, buckets: list[nccl.Bucket], timeout_s: float | None = None) -> None:
        """Copy the broadcast weights in place, one bucket in memory at a time (timeout: the group's)."""
        served = self.model.state_dict()
        received = set()
        for name, tensor in nccl.receive(self.weight_group, buckets, self.device):
            served[name].copy_(tensor)
            received.add(name)
        if missing := set(served) - received:
            raise RuntimeError(f"the broadcast left out {sorted(missing)}")

    def leave_weight_group(self) -> None:
        self.weight_group = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def checksum(self) -> str:
        return state_checksum(self.model.state_dict())
