"""YAML recipes and dotted overrides, composed into one nested dict before validation.

`compose` lays recipes over a base tree (later files win), then applies overrides such as
`algo.beta=0.04`; `describe_error` turns a pydantic ValidationError into one line per
problem. Plain dicts and YAML only: the models that validate the tree are in config.py.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class RecipeError(ValueError):
    """A recipe file or an override that cannot be read; the message names it."""


def compose(defaults: dict[str, Any], paths: str | Path | Sequence[str | Path] | None,
            overrides: Sequence[str]) -> dict[str, Any]:
    """`defaults`, then each recipe in `paths` laid over it in order, then each override."""
    if paths is None:
        paths = []
    elif isinstance(paths, (str, Path)):
        paths = [paths]
    tree = copy.deepcopy(defaults)  # the overrides write into the tree: never into the caller's
    for path in paths:
        tree = deep_merge(tree, read_recipe(path))
    for assignment in overrides:
        apply_override(tree, assignment)
    return tree


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply `a.b.c=value` to a nested dict; the value is parsed as YAML (numbers, lists...)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise RecipeError(f"override {assignment!r} is not of the form section.field=value")
    *parents, leaf = key.split(".")
    node: Any = tree
    for part in parents:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            if node.get(part) is None:  # an unset optional section (learner.lora: null) gets its defaults
                node[part] = {}
            node = node[part]
        else:
            raise RecipeError(f"override {key}: {part!r} is not a section")
    try:
        value = yaml.safe_load(raw) if raw else None
    except yaml.YAMLError as exc:
        raise RecipeError(f"override {key}: {raw!r} is not a YAML value ({first_problem(exc)})") from None
    if isinstance(node, list) and leaf.isdigit() and int(leaf) < len(node):
        node[int(leaf)] = value
    elif isinstance(node, dict):
        node[leaf] = value
    else:
        raise RecipeError(f"override {key}: cannot set {leaf!r}")


def first_problem(error: yaml.YAMLError) -> str:
    """What YAML found wrong, on one line (a reader's error spans several)."""
    return " ".join(str(getattr(error, "problem", None) or error).split())


def describe_error(error: ValidationError) -> str:
    """One line per problem: the dotted field, the bad value, what is wrong."""
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "config"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        if isinstance(item["input"], dict):  # a check across fields: its message names them
            lines.append(f"{field}: {message}" if item["loc"] else message)
        else:
            lines.append(f"{field} = {item['input']!r}: {message}")
    return "invalid config: " + "; ".join(lines).replace("\n", " ")  # (a validator's message may span lines)


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` laid over `base`, as a new tree that shares no dict or list with either (a
    resume's overrides must not write into the checkpoint's config they are compared with):
    mappings merge key by key, anything else replaces."""
    return copy.deepcopy(_laid_over(base, update))


def _laid_over(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """deep_merge's tree before its one copy: new dicts where both sides have one, else the values."""
    merged = dict(base)
    for key, value in update.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _laid_over(merged[key], value) if both else value
    return merged


def read_recipe(path: str | Path) -> dict[str, Any]:
    """One YAML recipe as a nested dict; RecipeError when it is missing or not a mapping."""
    try:
        tree = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise RecipeError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise RecipeError(f"config file {path} must hold a mapping of sections")
    return tree
