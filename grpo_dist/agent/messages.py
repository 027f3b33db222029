"""The OpenAI chat request as the endpoint accepts it, and messages compared by what they say.

`ChatRequest` is the schema (pydantic: a malformed body is a 400 naming the field); fields
the openai client adds that do not change the conversation (refusal, annotations, ...) are
allowed and ignored. `same_message` is the prefix rule's comparison: role, content (text
parts joined, None as ""), and tool calls by name and canonical JSON arguments.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpo_dist.common.types import SamplingSettings


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    temperature: float | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    n: int | None = None
    logprobs: bool | None = None
    stream: bool | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


def request_error(request: ChatRequest, sampling: SamplingSettings) -> str | None:
    """Why the request asks for sampling other than the run's (a 400), or None."""
    if request.n not in (None, 1):
        return f"n={request.n}: each request samples one reply (n=1)"
    if request.stream:
        return "stream=true is not supported"
    if request.temperature is not None and request.temperature != sampling.temperature:
        return f"temperature={request.temperature} differs from rollout.temperature={sampling.temperature} " \
               "(the learner's logprobs use it)"
    limit = request.token_limit
    if limit is not None and limit > sampling.max_new_tokens:
        return f"max_tokens={limit} is more than rollout.max_new_tokens={sampling.max_new_tokens}"
    if any(not s for s in request.stop_strings):
        return "an empty stop string"
    return None


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """A message's content as text: text parts joined, None as ""."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content)
    return content or ""


def canonical_arguments(arguments: str) -> str:
    """JSON arguments with sorted keys and no spaces (the text as is when it is not JSON)."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return arguments


def message_key(message: ChatMessage) -> tuple[Any, ...]:
    """What the prefix rule compares of a message."""
    calls = tuple((c.function.name, canonical_arguments(c.function.arguments)) for c in message.tool_calls or ())
    return message.role, text_of(message.content), calls


def template_message(message: ChatMessage) -> dict[str, Any]:
    """The message as chat templates take it: text content, tool calls with their arguments parsed."""
    rendered: dict[str, Any] = {"role": message.role, "content": text_of(message.content)}
    if message.tool_calls:
        rendered["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": _parsed(c.function.arguments)}} for c in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
