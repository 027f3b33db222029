"""The model's raw reply text -> OpenAI `content` and `tool_calls`, by the parser the config names.

Training keeps the model's raw ids, so a parser only decides what the agent sees. A reply that
tries a call and gets it wrong (bad JSON, no name, arguments not an object, an unclosed block)
comes back whole as plain content with malformed=True; no model output ever raises here.
Arguments are re-serialized canonically, json.dumps(obj, ensure_ascii=False), every character kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo_dist.env.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object: json.dumps(obj, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    malformed: bool


class _Malformed(Exception):
    """A tool call the reply attempts but does not get right."""


def _reject_constant(name: str) -> Any:
    raise _Malformed(f"{name} is not JSON")  # json.loads would take NaN and Infinity


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_object(text: str, start: int) -> tuple[dict[str, Any], int]:
    """The JSON object at text[start:] (leading whitespace skipped) and the index after it."""
    start = len(text) - len(text[start:].lstrip())
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise _Malformed(str(exc)) from None
    if not isinstance(value, dict):
        raise _Malformed("a tool call is not a JSON object")
    return value, end


def _call(name: Any, arguments: Any) -> tuple[str, str]:
    """(name, canonical arguments) of one call, or _Malformed."""
    if not isinstance(name, str) or not name:
        raise _Malformed("a tool call without a name")
    if not isinstance(arguments, dict):
        raise _Malformed("a tool call's arguments are not a JSON object")
    canonical = json.dumps(arguments, ensure_ascii=False)
    try:
        (name + canonical).encode("utf-8")
    except UnicodeEncodeError:
        raise _Malformed("a lone surrogate escape (\\udXXX) in a tool call") from None
    return name, canonical


def _hermes(text: str, pattern: str | None) -> tuple[list[tuple[str, str]], str]:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks; the text between is content."""
    calls, outside, position = [], [], 0
    while (opened := text.find(TOOL_CALL_OPEN, position)) >= 0:
        outside.append(text[position:opened])
        payload, end = _decode_object(text, opened + len(TOOL_CALL_OPEN))
        closed = len(text) - len(text[end:].lstrip())
        if not text.startswith(TOOL_CALL_CLOSE, closed):
            raise _Malformed("a <tool_call> block without its </tool_call>")
        calls.append(_call(payload.get("name"), payload.get("arguments")))
        position = closed + len(TOOL_CALL_CLOSE)
    outside.append(text[position:])
    return calls, "".join(outside)


def _llama3_json(text: str, pattern: str | None) -> tuple[list[tuple[str, str]], str]:
    """Llama 3.x JSON calls: the whole reply (after an optional <|python_tag|>) is one or more
    {"name": ..., "arguments"|"parameters": {...}} separated by ';' (one may end it).
    A reply that does not start with '{' is content (vLLM 0.32's llama3_json also takes JSON found
    after other text; a reply is a call or prose here, so prose quoting JSON stays prose)."""
    body = text.strip()
    body = body[len(PYTHON_TAG):].lstrip() if body.startswith(PYTHON_TAG) else body
    if not body.startswith("{"):
        if PYTHON_TAG in text:
            raise _Malformed("<|python_tag|> without a JSON call after it")
        return [], text
    calls, position = [], 0
    while True:
        payload, position = _decode_object(body, position)
        calls.append(_call(payload.get("name"), payload.get("arguments", payload.get("parameters"))))
        rest = body[position:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            raise _Malformed("text after a JSON tool call")
        if not rest:
            return calls, ""
        position = len(body) - len(rest)


def check_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled regex parser pattern (DOTALL), or ValueError naming what is wrong with it."""
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"the tool-call pattern {pattern!r} does not compile: {exc}") from None
    missing = [group for group in ("name", "arguments") if group not in compiled.groupindex]
    if missing:
        raise ValueError(f"the tool-call pattern {pattern!r} has no named group {' or '.join(missing)}: "
                         "write (?P<name>...) and (?P<arguments>...)")
    return compiled


def _regex(text: str, pattern: str | None) -> tuple[list[tuple[str, str]], str]:
    """Each match of the user's pattern is a call (its `arguments` group JSON); the rest is content."""
    calls, outside, position = [], [], 0
    for match in check_pattern(pattern or "").finditer(text):
        outside.append(text[position:match.start()])
        arguments, end = _decode_object(match["arguments"] or "", 0)
        if (match["arguments"] or "")[end:].strip():
            raise _Malformed("text after a call's JSON arguments")
        calls.append(_call(match["name"], arguments))
        position = match.end()
    outside.append(text[position:])
    return calls, "".join(outside)


# A parser: (reply text, the regex pattern) -> ([(name, canonical arguments)], content), or _Malformed.
_PARSE: dict[str, Callable[[str, str | None], tuple[list[tuple[str, str]], str]]] = {
    "hermes": _hermes, "llama3_json": _llama3_json, "regex": _regex}
PARSERS = tuple(_PARSE)  # the names the config accepts


def parse_reply(text: str, parser: str, call_ids: Callable[[int], str], pattern: str | None = None) -> ParsedReply:
    """`text` as content and tool calls (ids from call_ids(0), call_ids(1), ...); see the docstring."""
    if parser not in PARSERS:
        raise ValueError(f"unknown tool-call parser {parser!r}: one of {', '.join(PARSERS)}")
    if parser == "regex" and pattern is None:
        raise ValueError("the regex tool-call parser needs a pattern")
    try:
        calls, content = _PARSE[parser](text, pattern)
    except _Malformed:
        return ParsedReply(text, (), True)
    if not calls:
        return ParsedReply(text, (), False)
    tool_calls = tuple(ToolCall(call_ids(index), name, arguments) for index, (name, arguments) in enumerate(calls))
    return ParsedReply(content.strip() or None, tool_calls, False)
