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

    The randomness is not here: every prompt of a call comes with its own seed, and each of
    its `n` completions draws from a stream of its own (seeding.py).
    """

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16


@dataclass
class Completion:
    """One sampled continuation of a prompt.

    `logprobs[i]` is the sampler's log-probability of `token_ids[i]` after temperature
    scaling, i.e. log softmax(logits / temperature); `finish_reason` is "stop" (an EOS
    token ended it and is included in `token_ids`) or "length" (truncated).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


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
