"""The episodes of the current rollout call, shared by the endpoint's thread and the runner's.

The endpoint posts requests (`submit`), the agent host's reader posts its events (`host_event`),
and the runner waits on `changed` until a round can be served. One condition guards it all;
no tokenizing or generating happens under it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from grpo_dist.agent.episode import AgentEpisode, Pending, RequestRefused
from grpo_dist.agent.messages import ChatRequest, request_error
from grpo_dist.common.types import SamplingSettings

CALL_OVER = "the rollout call it belonged to is over"


class Board:
    """Episodes by id, the call's sampling, and the agent host's progress (see the module docstring)."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.episodes: dict[str, AgentEpisode] = {}
        self.sampling = SamplingSettings(n=1)
        self.concurrency = 1

    def open(self, episodes: list[AgentEpisode], sampling: SamplingSettings, concurrency: int) -> None:
        with self.changed:
            self.episodes = {episode.episode_id: episode for episode in episodes}
            self.sampling, self.concurrency = sampling, concurrency

    def submit(self, episode_id: str, request: ChatRequest, answer: Callable[[int, dict[str, Any]], None]) -> None:
        """Queue a request for its episode's next round; raises RequestRefused (404, 409, 400)."""
        with self.changed:
            episode = self.episodes.get(episode_id)
            if episode is None:
                raise RequestRefused(404, f"no episode {episode_id!r} on this worker")
            if episode.ended is not None:
                raise RequestRefused(409, f"episode {episode_id!r} has ended: {episode.ended}")
            if episode.pending is not None:
                raise RequestRefused(409, f"episode {episode_id!r} already has a request waiting")
            error = request_error(request, self.sampling)
            if error is not None:
                episode.requests_refused += 1
                raise RequestRefused(400, error)
            episode.pending = Pending(request, answer)
            self.changed.notify_all()

    def host_event(self, event: dict[str, Any], call: dict[str, AgentEpisode]) -> None:
        """The host of `call` (its episodes by id) started an agent, or reported what it returned or
        how it failed."""
        with self.changed:
            episode = call.get(str(event.get("id")))
            if episode is None:
                return
            if event.get("event") == "started":
                episode.started_at = time.monotonic()
            else:
                record_result(episode, event)
            self.changed.notify_all()

    def host_exited(self, call: dict[str, AgentEpisode]) -> None:
        """The events of `call`'s host ended (it exited or was killed): its unfinished episodes fail
        now, not at the call's deadline."""
        with self.changed:
            for episode in call.values():
                if not episode.returned and episode.ended is None:
                    self.end(episode, "its agent host exited", "the agent host exited before the agent returned "
                             "(its error, if any, is in the rollout worker's log)")
            self.changed.notify_all()

    def end(self, episode: AgentEpisode, reason: str, error: str | None = None) -> None:
        """End an episode server-side (its requests now 409); caller holds `changed`."""
        if error is not None and episode.error is None:
            episode.error = error
        episode.ended = episode.ended or reason
        if episode.pending is not None:
            episode.pending.answer(409, error_body(f"episode {episode.episode_id!r} has ended: {reason}", 409))
            episode.pending = None

    def close(self) -> None:
        """The call is over: every episode ends (late requests get 409 until the next call)."""
        with self.changed:
            for episode in self.episodes.values():
                self.end(episode, CALL_OVER, None if episode.returned else "the agent did not return before "
                         "the rollout call's deadline")


def record_result(episode: AgentEpisode, event: dict[str, Any]) -> None:
    """The host's result line: a finite reward and info, or the episode's failure."""
    episode.returned = True
    reward = event.get("reward")
    if event.get("error") is not None or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        episode.error = episode.error or str(event.get("error") or f"the agent returned reward {reward!r}")
    elif episode.trajectory is None:
        episode.error = episode.error or "the agent returned without calling the model"
    else:
        episode.step_rewards, episode.infos = [float(reward)], [dict(event.get("info") or {})]
        if episode.trajectory.stop_reason is None:
            episode.trajectory.stop_reason = "done"
    episode.ended = episode.ended or "the agent returned"


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             409: "conflict_error", 413: "invalid_request_error"}
    return {"error": {"message": message, "type": kinds.get(status, "server_error"), "param": param,
                      "code": str(status)}}
