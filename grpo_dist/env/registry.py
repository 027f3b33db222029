"""Environments by name: a built-in short name or any `package.module:Class`, checked before Ray starts."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from grpo_dist.env.base import Environment

# Built-in environments, short name -> `module:Class`.
BUILTIN_ENVS: dict[str, str] = {
    "code_feedback": "grpo_dist.env.code_feedback:CodeFeedback",
    "python_tool": "grpo_dist.env.python_tool:PythonTool",
    "arithmetic_retry": "grpo_dist.env.arithmetic_retry:ArithmeticRetry",
    "arithmetic_reveal": "grpo_dist.env.arithmetic_reveal:ArithmeticReveal",
}


def load_environment(name: str) -> type[Environment]:
    """The Environment subclass behind `name`; a ValueError that says what is wrong otherwise."""
    spec = BUILTIN_ENVS.get(name, name)
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"{name!r} is neither a built-in environment {sorted(BUILTIN_ENVS)} nor of the form "
                         "package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"environment {name!r}: cannot import {module_name}: {exc}") from None
    found = getattr(module, class_name, None)
    if found is None:
        raise ValueError(f"environment {name!r}: {module_name} has no {class_name!r}")
    if not (inspect.isclass(found) and issubclass(found, Environment)):
        raise ValueError(f"environment {name!r}: {spec} is not a subclass of grpo_dist.env.Environment")
    return found


def check_env_options(name: str, kwargs: dict[str, Any]) -> None:
    """A ValueError unless `kwargs` fit the constructor of the environment `name`."""
    cls = load_environment(name)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"env.kwargs {sorted(kwargs)} do not fit {cls.__name__}{inspect.signature(cls)}: "
                         f"{exc}") from None
