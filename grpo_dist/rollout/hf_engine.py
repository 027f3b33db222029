"""Generation with plain transformers: the CPU fallback and the reference backend."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from grpo_dist.common.distinct import distinct_rows
from grpo_dist.common.models import load_causal_lm, load_tokenizer
from grpo_dist.rollout.engine import GenerationEngine
from grpo_dist.rollout.hf_decoding import preallocated_cache, use_grouped_decode
from grpo_dist.rollout.sampling import StopStrings, draw, regroup, requests, sampled_logprobs, stop_token_ids
from grpo_dist.common.types import Completion, SamplingSettings
from grpo_dist.weights import nccl
from grpo_dist.weights.buckets import Bucket
from grpo_dist.weights.checksum import state_checksum


class HFEngine(GenerationEngine):
    """Batched sampling with a KV-cached forward loop of its own, returning the sampler's logprobs.

    Each completion draws from its own torch.Generator, seeded by
    `seeding.completion_seed(seed, j)`, one uniform number per token: its tokens depend on
    its seed and the weights, not on the other rows of the batch. The distribution and the
    stopping rules are rollout/sampling.py's, the same as the vLLM engine's; the checkpoint's
    generation config contributes its EOS ids and nothing else.
    """

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu") -> None:
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_causal_lm(model_path, dtype, device)
        use_grouped_decode(self.model)
        self.device = device
        self.stop_ids = stop_token_ids(model_path, self.tokenizer)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings,
                 seeds: list[int]) -> list[list[Completion]]:
        """Sample `sampling.n` completions per prompt; temperature 0 is greedy."""
        rows = requests(prompt_ids, sampling, seeds)
        if not rows:
            return []
        greedy = sampling.temperature == 0
        completions = self._sample([ids for ids, _ in rows], None if greedy else [seed for _, seed in rows], sampling)
        return regroup(completions, sampling)

    @torch.no_grad()
    def _sample(self, prompts: list[list[int]], seeds: list[int] | None,
                sampling: SamplingSettings) -> list[Completion]:
        """One completion per prompt; rows leave the batch (and the KV cache) as they finish."""
        generators = None if seeds is None else [
            torch.Generator(device=self.device).manual_seed(seed) for seed in seeds
        ]
        stop_strings = StopStrings(self.tokenizer, sampling.stop)
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish = ["length"] * len(prompts)
        input_ids, attention_mask = self._left_padded(prompts)
        positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        # A prompt's G rows share its prefill: each distinct prompt runs once, then its cache
        # rows and last logits are copied to every row that samples from it.
        first, owner = distinct_rows(prompts)
        cache = self._kv_cache(room=input_ids.shape[1] + sampling.max_new_tokens)
        out = self.model(input_ids=input_ids[first], attention_mask=attention_mask[first], position_ids=positions[first],
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1]
        if len(first) < len(prompts):
            rows = torch.tensor(owner, device=self.device)
            cache.reorder_cache(rows)
            logits = logits[rows]
        alive = list(range(len(prompts)))  # the rows still sampling, in batch order
        for length in range(1, sampling.max_new_tokens + 1):
            step_logprobs = sampled_logprobs(logits, sampling)
            chosen = draw(step_logprobs, None if generators is None else [generators[r] for r in alive])
            chosen_logprobs = step_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
            keep = []
            for k, (row, token, logprob) in enumerate(zip(alive, chosen.tolist(), chosen_logprobs.tolist())):
                tokens[row].append(token)
                logprobs[row].append(logprob)
                if token in self.stop_ids or (stop_strings and stop_strings.found(tokens[row])):
                    finish[row] = "stop"
                else:
                    keep.append(k)
            if not keep or length == sampling.max_new_tokens:
                break
            if len(keep) < len(alive):
                index = torch.tensor(keep, device=self.device)
                cache.reorder_cache(index)
                alive, chosen = [alive[k] for k in keep], chosen[index]
                attention_mask, positions = attention_mask[index], positions[index]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(alive), 1)], dim=-1)
            positions = positions[:, -1:] + 1
            out = self.model(input_ids=chosen.unsqueeze(-1), attention_mask=attention_mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[:, -1]
        return [
            Completion(token_ids=ids, logprobs=lps, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                       finish_reason=reason)
            for ids, lps, reason in zip(tokens, logprobs, finish)
        ]

    def _kv_cache(self, room: int) -> Cache:
        """An empty KV cache for a call whose rows hold up to `room` positions (rollout/hf_decoding.py)."""
        return preallocated_cache(self.model.config, room)

    def _left_padded(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(ids) for ids in prompt_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompt_ids], device=self.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=self.device)
        return input_ids, mask

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict, strict=True)

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, timeout_s: float,
                          backend: str = "nccl") -> None:
        """Join the learner's weight group as rank `rank_offset` (weights/nccl.py)."""
        self.weight_group = nccl.communicator(backend, host, port, rank_offset, world_size,
                                                      self.device, timeout_s)

    @torch.no_grad()
    def receive_weights(self, buckets: list[Bucket], timeout_s: float | None = None) -> None:
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

