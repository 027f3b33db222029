"""Tools and tool calls as text, the hermes way (Qwen2.5's template): for templates that ignore tools.

The same layout Qwen2.5's template writes, so that a model prompted this way and a Qwen-style
template agree: a system block listing the tools as JSON inside <tools></tools>, and each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (json.dumps, non-ASCII kept).
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The system text that shows `tools` (OpenAI's schema) and how to call them."""
    return _TOOLS_HEAD + "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools) + _TOOLS_TAIL


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as a hermes block, as Qwen2.5's template writes it."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def arguments_object(arguments: str | dict[str, Any]) -> dict[str, Any]:
    """A call's arguments as an object: OpenAI sends JSON text, templates want the object."""
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def assistant_text(content: str | None, calls: list[dict[str, Any]]) -> str:
    """An assistant message with OpenAI `tool_calls` as the text of its content and its calls."""
    blocks = [call_text(call["function"]["name"], arguments_object(call["function"]["arguments"])) for call in calls]
    return "\n".join([content, *blocks] if content else blocks)


def with_tools_block(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with the tools block at the start of the system message (a new one if none)."""
    block = tools_block(tools)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{block}\n\n{messages[0]['content']}"}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def renderable(message: dict[str, Any], native_tools: bool) -> dict[str, Any]:
    """An assistant message with OpenAI `tool_calls` (content None) as a template can render it:
    native_tools, the calls with object arguments and content ""; else the calls' hermes text as content."""
    calls = message.get("tool_calls") or []
    if message.get("role") != "assistant" or (message.get("content") is not None and not calls):
        return message
    if not native_tools:
        return {key: value for key, value in message.items() if key != "tool_calls"} | \
            {"content": assistant_text(message.get("content"), calls)}
    objects = [{**call, "function": {**call["function"], "arguments": arguments_object(call["function"]["arguments"])}}
               for call in calls]
    return {**message, "content": message.get("content") or "", **({"tool_calls": objects} if objects else {})}
