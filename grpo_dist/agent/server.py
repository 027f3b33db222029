"""The OpenAI-compatible endpoint of one rollout worker: aiohttp on a daemon thread's event loop.

Routes, under /episodes/{episode_id}/v1 (the episode id is in the client's base URL):
POST /chat/completions and GET /models. Every request carries the run's key (Bearer; else 401).
A chat request is checked (size 413, JSON and schema 400) and handed to the Board; the
handler then waits until the runner's thread answers it. Every error is OpenAI's
{"error": {...}} shape with a 4xx status; nothing the client sends gets a traceback.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from grpo_dist.agent.board import Board, error_body
from grpo_dist.agent.episode import RequestRefused
from grpo_dist.agent.messages import ChatRequest


class AgentServer:
    """Serves `board`'s episodes on `host` (127.0.0.1, or "node": this node's IP) at an OS-chosen port."""

    def __init__(self, board: Board, host: str, max_request_bytes: int, model: str) -> None:
        self.board, self.max_request_bytes, self.model = board, max_request_bytes, model
        self.api_key = secrets.token_urlsafe(32)
        self.host = node_ip() if host == "node" else host
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="agent-endpoint").start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)

    def base_url(self, episode_id: str) -> str:
        return f"http://{self.host}:{self.port}/episodes/{episode_id}/v1"

    async def _start(self) -> int:
        app = web.Application(client_max_size=self.max_request_bytes, middlewares=[self._guard])
        app.router.add_post("/episodes/{episode_id}/v1/chat/completions", self._chat)
        app.router.add_get("/episodes/{episode_id}/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The key first; then any refusal or failure as an OpenAI error, never a traceback."""
        if not secrets.compare_digest(request.headers.get("Authorization", ""), f"Bearer {self.api_key}"):
            return _error(401, "missing or wrong API key (Authorization: Bearer <the run's key>)")
        try:
            return await handler(request)
        except RequestRefused as exc:
            return _error(exc.status, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the request body is over agent.max_request_bytes={self.max_request_bytes}")
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason)
        except Exception as exc:  # noqa: BLE001 - a bug of ours costs the request, not the endpoint
            return _error(500, f"internal error: {type(exc).__name__}")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "grpo_dist"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        if (request.content_length or 0) > self.max_request_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_request_bytes, actual_size=request.content_length)
        try:
            body = ChatRequest.model_validate(json.loads(await request.read()))
        except ValueError as exc:  # JSONDecodeError and ValidationError
            raise RequestRefused(400, _first_line(exc)) from None
        answered: asyncio.Future = self.loop.create_future()

        def answer(status: int, payload: dict[str, Any]) -> None:  # from the runner's thread
            self.loop.call_soon_threadsafe(lambda: answered.done() or answered.set_result((status, payload)))

        self.board.submit(request.match_info["episode_id"], body, answer)
        status, payload = await answered
        return web.json_response(payload, status=status)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


def _first_line(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return f"malformed JSON: {exc}"


def node_ip() -> str:
    """This node's IP as the cluster sees it (Ray's)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostbyname(socket.gethostname())
