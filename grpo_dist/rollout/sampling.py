"""What every engine agrees on: the distribution a token is drawn from, and when a completion stops.

Both engines sample softmax(logits / T) restricted by top-k, then top-p, as vLLM's sampler
does, and stop at the same token ids and stop strings. Nothing from a checkpoint's
generation_config.json changes sampling except its EOS ids, which both engines stop at.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import AutoConfig, GenerationConfig, PreTrainedTokenizerBase

from grpo_dist.config.schema import RolloutConfig, resolve_path
from grpo_dist.common.seeding import completion_seed
from grpo_dist.common.types import Completion, SamplingSettings


def sampling_settings(rollout: RolloutConfig, greedy: bool = False) -> SamplingSettings:
    """The configured sampling; `greedy`: one completion per prompt at temperature 0 (evaluation)."""
    return SamplingSettings(
        n=1 if greedy else rollout.group_size,
        temperature=0.0 if greedy else rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens,
        stop=tuple(rollout.stop),
    )


def check_seeds(prompt_ids: list[list[int]], seeds: list[int]) -> None:
    """One seed per prompt (seeding.prompt_seed), or a ValueError that says how many of each."""
    if len(seeds) != len(prompt_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(seeds)} seeds")


def requests(prompt_ids: list[list[int]], sampling: SamplingSettings,
             seeds: list[int]) -> list[tuple[list[int], int | None]]:
    """(prompt ids, seed) of every completion to sample: completion j of prompt i gets
    `completion_seed(seeds[i], j)`. Greedy: one per prompt, without a seed (see `regroup`)."""
    check_seeds(prompt_ids, seeds)
    if sampling.temperature == 0:
        return [(ids, None) for ids in prompt_ids]
    return [(ids, completion_seed(seed, j)) for ids, seed in zip(prompt_ids, seeds) for j in range(sampling.n)]


def regroup(completions: list[Completion], sampling: SamplingSettings) -> list[list[Completion]]:
    """The completions of `requests`, one list of `sampling.n` per prompt (greedy: copies)."""
    if sampling.temperature == 0:
        return [[replace(c, token_ids=list(c.token_ids), logprobs=list(c.logprobs)) for _ in range(sampling.n)]
                for c in completions]
    return [completions[i : i + sampling.n] for i in range(0, len(completions), sampling.n)]


def stop_token_ids(model_path: str, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS and the generation config's EOS ids, sorted.

    Like vLLM, the generation config is the checkpoint's generation_config.json, or the one
    transformers derives from config.json when there is none.
    """
    path = resolve_path(model_path)
    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    ids = generation.eos_token_id
    ids = set() if ids is None else {ids} if isinstance(ids, int) else set(ids)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def sampled_logprobs(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """log p of every token under the distribution sampled from, [rows, vocab] float32.

    Temperature, then top-k, then top-p (on the top-k-renormalized probabilities; the most
    likely token always stays); tokens cut away get -inf. Greedy (temperature 0): the raw
    log softmax, as vLLM reports it.
    """
    logits = logits.float()
    if sampling.temperature == 0:
        return logits.log_softmax(dim=-1)
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        above = probs.cumsum(dim=-1) - probs  # the mass of the tokens more likely than each
        cut = above >= sampling.top_p  # the first token has none above it and always stays
        logits = logits.scatter(-1, order, ordered.masked_fill(cut, float("-inf")))
    return logits.log_softmax(dim=-1)


def draw(logprobs: torch.Tensor, generators: list[torch.Generator] | None) -> torch.Tensor:
    """One token per row: argmax when `generators` is None, else inverse-CDF sampling with one
    uniform number from row i's own generator, so a row's token depends on nothing else."""
    if generators is None:
        return logprobs.argmax(dim=-1)
    uniform = torch.cat([torch.rand(1, generator=g, device=g.device) for g in generators]).to(logprobs.device)
    cdf = logprobs.exp().cumsum(dim=-1)
    # right=True skips the tokens of probability 0, whose cdf equals their predecessor's
    tokens = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return tokens.clamp(max=logprobs.shape[-1] - 1)


class StopStrings:
    """Whether a completion's text now contains one of the stop strings.

    Only the last tokens are decoded (enough to hold the longest stop string), since an
    earlier occurrence would have stopped the completion already.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.window = max((len(s) for s in stop), default=0) + 8  # tokens of >= 1 character, some special

    def __bool__(self) -> bool:
        return bool(self.stop)

    def found(self, token_ids: list[int]) -> bool:
        text = self.tokenizer.decode(token_ids[-self.window :], skip_special_tokens=True)
        return any(s in text for s in self.stop)
