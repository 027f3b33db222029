"""Plain dataclasses that travel between the actors on the hot path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One dataset row, rendered and tokenized once (in the driver, by data.py).

    `index` is the row's position in its split: the unit the data cursor counts.
    """

    index: int
    row: dict[str, Any]
    text: str
    ids: list[int]


@dataclass(frozen=True)
class SamplingSettings:
    """How one call to an engine samples. temperature 0 means greedy.

    Each token is drawn from softmax(logits / temperature), restricted to the `top_k` most
    likely tokens (0: all) and then to the smallest set whose probability reaches `top_p`,
    renormalized. A completion ends after `max_new_tokens`, at a stop token (the tokenizer's
    EOS and the checkpoint's generation-config EOS ids) or once its text contains one of
    `stop` (the token that completes it is kept). Nothing else changes the distribution.

    The randomness is not here: every prompt of a call comes with its own seed, and each of
    its `n` completions draws from a stream of its own (seeding.py).
    """

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    stop: tuple[str, ...] = ()


@dataclass
class Completion:
    """One sampled continuation of a prompt.

    `logprobs[i]` is the sampler's log-probability of `token_ids[i]` in the distribution it
    was drawn from: log softmax(logits / temperature) over the tokens top_k and top_p kept
    (greedy: log softmax(logits)). `finish_reason` is "stop" (a stop token or stop string
    ended it; that token is the last of `token_ids`) or "length" (truncated). `text` is
    `token_ids` decoded without special tokens.

    `loss_mask` (None: every token) is 1 on the model's own tokens: a multi-turn episode
    (env/) puts the environment's tokens among them with mask 0 and logprob 0, and `episode`
    holds what rewards and samples.jsonl see of it (env/groups.py); `text` is its last reply.
    An episode with env.history=per_turn trains on `turns` instead: each turn's whole sequence
    (context and reply) with its loss mask and logprobs, one learner row each; then `token_ids`
    are only its replies' tokens, for counting.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    loss_mask: list[int] | None = None
    episode: dict[str, Any] | None = None
    turns: list[tuple[list[int], list[int], list[float]]] | None = None


@dataclass
class Group:
    """G completions of one prompt, produced by one policy version."""

    prompt_index: int
    row: dict[str, Any]
    prompt: str
    prompt_ids: list[int]
    completions: list[Completion]
    policy_version: int
    rewards: list[float] = field(default_factory=list)
    reward_parts: dict[str, list[float]] = field(default_factory=dict)
