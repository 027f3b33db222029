"""Rows of token ids that repeat: a GRPO batch holds each prompt G times, and both the engine's
prefill and the learner's shared prompts run each distinct one once."""

from __future__ import annotations

from collections.abc import Sequence


def distinct_rows(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """The index of each distinct row's first occurrence, and for each row the position of its own among them."""
    position: dict[tuple[int, ...], int] = {}
    owner = [position.setdefault(tuple(row), len(position)) for row in rows]
    first = [0] * len(position)
    for index in reversed(range(len(owner))):
        first[owner[index]] = index
    return first, owner
