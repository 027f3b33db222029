"""One agent episode: the agent's requests turned into a Trajectory, the engine's replies into answers.

Token rules (docs/agents.md): the first request's messages (and tools) are the opening. Each
later request must repeat the conversation so far, as it was returned to the agent
(messages.message_key), and add tool or user messages only; those go through
Trajectory.add_observation (the template's prefix check, loss mask 0). A request that rewrites
the conversation ends the episode (history_rewritten). The engine's reply ids and logprobs are
appended verbatim (loss mask 1), and the trajectory keeps the reply's raw text, so nothing the
model wrote is ever tokenized again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_dist.agent.messages import ChatMessage, ChatRequest, message_key, template_message
from grpo_dist.agent.tool_calls import parse_reply
from grpo_dist.env.base import EnvError
from grpo_dist.env.render import ChatRenderer
from grpo_dist.env.runner import Episode
from grpo_dist.env.trajectory import HISTORY_REWRITTEN, MAX_TURNS, Trajectory
from grpo_dist.common.types import Completion


class RequestRefused(Exception):
    """A request the episode cannot take: its HTTP status and OpenAI error message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Pending:
    """A request waiting for its round; `answer(status, body)` resolves the HTTP handler."""

    request: ChatRequest
    answer: Callable[[int, dict[str, Any]], None]


@dataclass
class AgentEpisode(Episode):
    """An Episode (env/runner.py) played through the endpoint, with the agent's side of it."""

    episode_id: str = ""
    conversation: list[tuple[Any, ...]] = field(default_factory=list)  # message_key of each, as the agent has them
    pending: Pending | None = None
    started_at: float | None = None  # when the host started the agent (runner clock)
    ended: str | None = None  # why its requests now get 409 (returned, failed, timed out)
    returned: bool = False  # the host reported its result
    tool_calls_malformed: int = 0
    requests_refused: int = 0

    @property
    def live(self) -> bool:
        """Started, neither returned nor ended: a round waits for its request."""
        return self.started_at is not None and not self.returned and self.ended is None

    def admit(self, request: ChatRequest, renderer: Callable[[list[dict] | None], ChatRenderer],
              limits: Any) -> list[int]:
        """Check the request against the token rules and append its new messages; the ids the
        engine samples after. Raises RequestRefused (the episode keeps what it has)."""
        if self.trajectory is None:
            try:
                self.trajectory = Trajectory(renderer(request.tools), [template_message(m) for m in request.messages],
                                             limits.max_episode_tokens, limits.max_observation_tokens, limits.history)
            except EnvError as exc:
                raise RequestRefused(400, str(exc)) from None
            self.conversation = [message_key(m) for m in request.messages]
        else:
            self._continue(request.messages)
        if self.turns >= limits.max_turns:
            self.trajectory.stop_reason = MAX_TURNS
        if self.trajectory.done:
            raise RequestRefused(400, f"the episode is over ({self.trajectory.stop_reason}): no more replies")
        return self.trajectory.engine_input()

    def _continue(self, messages: list[ChatMessage]) -> None:
        trajectory = self.trajectory
        assert trajectory is not None
        if trajectory.done:
            raise RequestRefused(400, f"the episode is over ({trajectory.stop_reason}): no more replies")
        seen, new = messages[: len(self.conversation)], messages[len(self.conversation):]
        if [message_key(m) for m in seen] != self.conversation or not new or \
                any(m.role == "assistant" for m in new):
            trajectory.stop_reason = HISTORY_REWRITTEN
            raise RequestRefused(400, "the messages must repeat the conversation so far, as returned, and add "
                                 "tool or user messages only (history_rewritten: the episode is over)")
        trajectory.add_observation([template_message(m) for m in new])
        self.conversation += [message_key(m) for m in new]

    def answer(self, completion: Completion, parser: str, pattern: str | None, model: str,
               want_logprobs: bool, prompt_tokens: int) -> dict[str, Any]:
        """Append the engine's reply verbatim; the chat.completion the agent gets for it."""
        assert self.trajectory is not None
        turn = self.turns
        text = self.trajectory.add_reply(completion.token_ids, completion.logprobs, completion.finish_reason)
        self.replies.append(text)
        parsed = parse_reply(text, parser, lambda i: f"call_{self.episode_id}_{turn}_{i}", pattern)
        self.tool_calls_malformed += int(parsed.malformed)
        content, calls = parsed.content, [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls]
        message = ChatMessage(role="assistant", content=content, tool_calls=calls or None)
        self.conversation.append(message_key(message))
        finish = "tool_calls" if calls else ("length" if completion.finish_reason == "length" else "stop")
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content,
                                                          "tool_calls": calls or None},
                                  "finish_reason": finish, "logprobs": None}
        if want_logprobs:
            choice["logprobs"] = {"content": [_token_logprob(self.trajectory.renderer, i, lp) for i, lp in
                                              zip(completion.token_ids, completion.logprobs)]}
        return {"id": f"chatcmpl-{self.episode_id}-{turn}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(completion.token_ids),
                          "total_tokens": prompt_tokens + len(completion.token_ids)}}


def _token_logprob(renderer: ChatRenderer, token_id: int, logprob: float) -> dict[str, Any]:
    token = renderer.decode([token_id])
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
