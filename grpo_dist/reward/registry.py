"""Reward functions by name: built-in short names, or any `package.module:function`."""

from __future__ import annotations

import importlib
from typing import Callable

RewardFn = Callable[..., float]

BUILTIN_REWARDS: dict[str, str] = {
    "exact_answer": "grpo_dist.reward.rules:exact_answer",
    "answer_format": "grpo_dist.reward.rules:answer_format",
}


def reward_spec(name: str) -> str:
    """The importable `module:function` for a configured reward name."""
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    module, sep, function = name.partition(":")
    if not sep or not module or not function:
        raise ValueError(
            f"{name!r} is neither a built-in reward {sorted(BUILTIN_REWARDS)} nor of the form package.module:function"
        )
    return name


def load_reward(name: str) -> RewardFn:
    """Import the callable behind a reward name; a clear ValueError when it is not there."""
    module_name, _, function_name = reward_spec(name).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {name!r}: cannot import {module_name}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"reward {name!r}: {module_name} has no function {function_name!r}")
    return function
