"""Reward functions by name: built-in short names, or any `package.module:function`.

A reward comes in one of four kinds, told apart by how it is defined:
- "sample": `fn(prompt, completion, **fields) -> float`, run in the scoring pool's
  processes, one deadline per sample;
- "inline": the same, marked with `@inline`: quick and pure (a parse and a comparison), so
  called in the reward actor's process, on a thread under the same deadline, with no process
  of its own (the default job's 256 exact_answer scores a step: 8.1 ms through the pool, 1.1 ms inline); an exception
  still costs only its sample, and one that passes its deadline moves the reward into the pool;
- "async": `async def fn(prompt, completion, **fields) -> float`, awaited in the reward
  actor, every sample of a batch concurrently, each under the same deadline;
- "batched": marked with `@batched`, `fn(prompts, completions, **fields) -> list[float]`
  where each field is a list with one value per sample. A batched class is built once per
  reward actor with the configured options (a model stays loaded) and its instances are
  called per batch, in the actor's process, on a thread under `reward.batch_timeout_s`.

Options (`RewardFunctionConfig.kwargs`) are keyword arguments: every call gets them, or
a batched class's constructor. `check_options` validates them before any actor starts.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any, Callable, Literal, TypeVar

from pydantic import TypeAdapter, ValidationError

Reward = Callable[..., Any]
RewardKind = Literal["sample", "inline", "async", "batched"]
R = TypeVar("R")

BUILTIN_REWARDS: dict[str, str] = {
    "exact_answer": "grpo_dist.reward.rules:exact_answer",
    "math_answer": "grpo_dist.reward.rules:math_answer",
    "answer_format": "grpo_dist.reward.rules:answer_format",
    "length_penalty": "grpo_dist.reward.rules:length_penalty",
    "unit_tests": "grpo_dist.reward.unit_tests:unit_test_reward",
    "reward_model": "grpo_dist.reward.model:RewardModel",
    "env_reward": "grpo_dist.env.rewards:env_reward",  # multi-turn: the environment's step rewards
}
# Filled in by the RewardWorker for rewards that name it as a parameter.
COMPLETION_TOKENS = "completion_tokens"
_DATA_PARAMETERS = {"prompt", "completion", "prompts", "completions", "self", COMPLETION_TOKENS}


def batched(reward: R) -> R:
    """Mark a function or class as a batched reward (lists in, list of floats out)."""
    reward.batched = True  # type: ignore[attr-defined]
    return reward


def inline(reward: R) -> R:
    """Mark a per-sample reward to be called in the reward actor's process (see the module docstring):
    only for a quick one that cannot crash its process; a hang costs its sample and a stuck thread."""
    reward.inline = True  # type: ignore[attr-defined]
    return reward


def reward_kind(reward: Reward) -> RewardKind:
    if getattr(reward, "batched", False) is True:
        return "batched"
    if inspect.isclass(reward):
        raise ValueError(f"{reward.__name__} is a class: a reward class must be marked @batched")
    if inspect.iscoroutinefunction(reward):
        return "async"
    return "inline" if getattr(reward, "inline", False) is True else "sample"


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


def load_reward(name: str) -> Reward:
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


def takes_completion_tokens(reward: Reward) -> bool:
    """Whether the reward names a `completion_tokens` parameter (the completion's token count)."""
    return COMPLETION_TOKENS in inspect.signature(reward).parameters


def row_fields_needed(reward: Reward, options: dict[str, Any]) -> list[str]:
    """The row fields a reward cannot do without: its parameters with no default that are
    neither data nor configured options (e.g. `answer` for math_answer)."""
    target = reward.__call__ if inspect.isclass(reward) else reward
    return [
        name
        for name, parameter in inspect.signature(target).parameters.items()
        if name not in _DATA_PARAMETERS and name not in options and parameter.default is parameter.empty
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    ]


def check_options(reward: Reward, options: dict[str, Any]) -> None:
    """Raise ValueError unless each option is a named parameter of `reward` of its annotated type.

    Then the reward's own `check_options(**options)`, when it has one, checks the values.
    """
    kind = reward_kind(reward)
    target = reward.__init__ if inspect.isclass(reward) else reward
    parameters = {
        name: parameter
        for name, parameter in inspect.signature(target).parameters.items()
        if name not in _DATA_PARAMETERS
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for a {kind} reward; it takes {sorted(parameters)}")
    hints = typing.get_type_hints(target)
    for name, value in options.items():
        if name in hints:
            try:
                TypeAdapter(hints[name]).validate_python(value)
            except ValidationError as exc:
                raise ValueError(f"option {name}={value!r}: {exc.errors()[0]['msg']}") from None
    extra_check = getattr(reward, "check_options", None)
    if extra_check is not None:
        extra_check(**options)


def check_reward_options(name: str, options: dict[str, Any]) -> None:
    """What the config checks of a reward function before any actor starts: the reward called
    `name` takes `options` (`check_options`); a ValueError that names the reward otherwise."""
    try:
        check_options(load_reward(name), options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"reward {name!r} kwargs: {exc}") from None
