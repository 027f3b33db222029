"""Agent episodes batched over a generation engine: `AgentRunner.run(rows, sampling, seeds)`.

The interface of env/runner.py's EpisodeRunner (G = sampling.n episodes per row, one list of
Episodes per row), played by the user's agent through the worker's endpoint (server.py): the
agents run in a child process (host.py), their requests wait on the Board, and the engine
calls stay on this (the actor's) thread, so one call holds one policy version.

Rounds: a round is served when every live episode (started, neither returned nor ended) has a
request waiting and every slot the host freed has been refilled: one engine call per distinct
(max_tokens, stop) among the requests, each sampled with turn_seed(episode seed, turn). Batches
never depend on timing, so a chunk generated again (resume, a restarted worker) plays the same
episodes. Deadlines: an episode past agent.timeout_s from its start is ended here (whatever its
agent does), and the host's process group is killed when every episode has ended or when the
call's deadline passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

from grpo_dist.agent.board import Board, error_body
from grpo_dist.agent.config import AgentConfig, call_deadline_s
from grpo_dist.agent.episode import AgentEpisode, RequestRefused
from grpo_dist.agent.host import OWNER_VARIABLE
from grpo_dist.agent.server import AgentServer
from grpo_dist.env.render import ChatRenderer
from grpo_dist.env.runner import episode_sums
from grpo_dist.rollout.engine import GenerationEngine
from grpo_dist.common.seeding import completion_seed, turn_seed
from grpo_dist.common.types import SamplingSettings

class AgentRunner:
    """Plays agent episodes on `engine`, serving them on an endpoint of its own (see the module docstring)."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, agent: AgentConfig, model: str = "policy") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("agent episodes are chat conversations: the model's tokenizer has no chat template")
        self.engine, self.tokenizer, self.agent, self.model = engine, tokenizer, agent, model
        self.renderers: dict[str, ChatRenderer] = {}
        self.board = Board()
        self.server = AgentServer(self.board, agent.host, agent.max_request_bytes, model)
        self.spare = spawn_host(agent.name)  # started ahead of its call: its 2-3 s of imports overlap other work

    def close(self) -> None:
        """Ends the spare host and the endpoint: a runner its owner is done with leaves no process behind."""
        stop_host(self.spare)
        self.server.stop()

    def renderer(self, tools: list[dict] | None) -> ChatRenderer:
        """The chat renderer for a tool list (one per distinct list)."""
        key = json.dumps(tools, sort_keys=True)
        if key not in self.renderers:
            self.renderers[key] = ChatRenderer(self.tokenizer, tools or None)
        return self.renderers[key]

    def run(self, rows: list[dict[str, Any]], sampling: SamplingSettings,
            seeds: list[int]) -> list[list[AgentEpisode]]:
        """`sampling.n` episodes per row, one list per row."""
        if len(seeds) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(seeds)} seeds")
        episodes = [AgentEpisode(i, j, seed, episode_id=f"{i}.{j}.{seed}")
                    for i, row_seed in enumerate(seeds) for j in range(sampling.n)
                    for seed in [completion_seed(row_seed, j)]]
        self.board.open(episodes, replace(sampling, n=1), self.agent.concurrency)
        host, reader = self._start_host(rows, episodes)
        try:
            self._play(episodes, time.monotonic() + call_deadline_s(self.agent, len(episodes)))
        finally:
            stop_host(host)
            reader.join(timeout=10)  # its events are of this call's episodes only, whenever they come
            self.board.close()
            self.spare = spawn_host(self.agent.name)
        return [episodes[i : i + sampling.n] for i in range(0, len(episodes), sampling.n)]

    def _start_host(self, rows: list[dict[str, Any]],
                    episodes: list[AgentEpisode]) -> tuple[subprocess.Popen, threading.Thread]:
        job = {"agent": self.agent.name, "api_key": self.server.api_key, "concurrency": self.agent.concurrency,
               "timeout_s": self.agent.timeout_s,
               "episodes": [{"id": e.episode_id, "base_url": self.server.base_url(e.episode_id),
                             "task": rows[e.row_index]} for e in episodes]}
        host = self.spare if self.spare.poll() is None else spawn_host(self.agent.name)
        assert host.stdin is not None and host.stdout is not None
        host.stdin.write(json.dumps(job, default=repr) + "\n")
        host.stdin.flush()  # stdin stays open: its end tells the host that this worker died
        call = {episode.episode_id: episode for episode in episodes}
        reader = threading.Thread(target=self._read_events, args=(host.stdout, call), daemon=True, name="agent-host")
        reader.start()
        return host, reader

    def _read_events(self, stdout: Any, call: dict[str, AgentEpisode]) -> None:
        for line in stdout:
            try:
                self.board.host_event(json.loads(line), call)
            except ValueError:
                continue
        self.board.host_exited(call)

    def _play(self, episodes: list[AgentEpisode], deadline: float) -> None:
        """Serve rounds until every episode has ended or the call's deadline passes."""
        changed = self.board.changed
        while True:
            with changed:
                ready = self._wait_for_round(episodes, deadline)
                if ready is None:
                    return
                round_ = [(e, e.pending) for e in ready]
                for episode in ready:
                    episode.pending = None
            self._serve(round_)

    def _wait_for_round(self, episodes: list[AgentEpisode], deadline: float) -> list[AgentEpisode] | None:
        """The episodes of the next round, or None when the call is over; caller holds the condition."""
        while True:
            now = time.monotonic()
            for episode in episodes:
                if episode.live and now >= episode.started_at + self.agent.timeout_s:  # type: ignore[operator]
                    self.board.end(episode, "timed out", f"past agent.timeout_s={self.agent.timeout_s:g}")
            over = [e for e in episodes if e.returned or e.ended is not None]
            if len(over) == len(episodes) or now >= deadline:
                return None
            started = sum(e.started_at is not None for e in episodes)
            returned = sum(e.returned for e in episodes)
            live = [e for e in episodes if e.live]
            if started >= min(len(episodes), returned + self.agent.concurrency) and live and \
                    all(e.pending is not None for e in live):
                return live
            wake = min([deadline, *(e.started_at + self.agent.timeout_s for e in live)])  # type: ignore[operator]
            self.board.changed.wait(timeout=max(0.0, wake - now) + 0.01)

    def _serve(self, round_: list[tuple[AgentEpisode, Any]]) -> None:
        """Admit each request, then one engine call per (max_tokens, stop); answer every request."""
        sampling = self.board.sampling
        calls: dict[tuple[int, tuple[str, ...]], list[tuple[AgentEpisode, Any, list[int]]]] = defaultdict(list)
        for episode, pending in round_:
            try:
                ids = episode.admit(pending.request, self.renderer, self.agent)
            except RequestRefused as exc:
                episode.requests_refused += 1
                pending.answer(exc.status, error_body(str(exc), exc.status))
                continue
            except Exception as exc:  # noqa: BLE001 - a template that cannot render them: this episode fails
                with self.board.changed:
                    self.board.end(episode, "failed", f"the chat template raised {type(exc).__name__}: {exc}")
                pending.answer(400, error_body(f"the messages cannot be rendered: {exc}", 400))
                continue
            key = (pending.request.token_limit or sampling.max_new_tokens,
                   pending.request.stop_strings or sampling.stop)
            calls[key].append((episode, pending, ids))
        for (max_tokens, stop), served in sorted(calls.items()):
            settings = replace(sampling, max_new_tokens=max_tokens, stop=stop)
            outputs = self.engine.generate([ids for _, _, ids in served], settings,
                                           [turn_seed(e.seed, e.turns) for e, _, _ in served])
            for (episode, pending, ids), (completion,) in zip(served, outputs):
                pending.answer(200, episode.answer(completion, self.agent.tool_parser, self.agent.tool_call_regex,
                                                   self.model, bool(pending.request.logprobs), len(ids)))


def spawn_host(agent: str) -> subprocess.Popen:
    """An agent host that imports openai and the agent's module, then waits for its job on stdin."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                   OWNER_VARIABLE: str(os.getpid())}
    return subprocess.Popen([sys.executable, "-m", "grpo_dist.agent.host", agent], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True, env=environment)


def stop_host(host: subprocess.Popen) -> None:
    """Kills the host's process group (the host and whatever its agents started) and reaps the host."""
    with contextlib.suppress(ProcessLookupError):  # a host already reaped, its group empty
        os.killpg(host.pid, signal.SIGKILL)
    host.wait()


def agent_sums(episodes: list[AgentEpisode]) -> dict[str, Any]:
    """episode_sums (env/runner.py), and the agent's counts: malformed tool calls, refused requests."""
    return {**episode_sums(episodes),  # type: ignore[arg-type]
            "env/tool_calls_malformed": float(sum(e.tool_calls_malformed for e in episodes)),
            "env/requests_refused": float(sum(e.requests_refused for e in episodes))}
