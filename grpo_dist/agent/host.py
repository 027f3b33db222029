"""The agent host: a child process of the rollout worker where agents run, so they can be stopped.

    python -m grpo_dist.agent.host [AGENT]   (job as one JSON line on stdin; events as JSON lines on stdout)

The worker starts the host before its call (AGENT, the agent's name, is imported then, with openai).

Job: {"agent": "package.module:function", "api_key", "concurrency", "timeout_s",
"episodes": [{"id", "base_url", "task"}, ...]}. Episodes start in order, `concurrency` at
once, each with an openai.AsyncOpenAI of its own, under `timeout_s`. Events:
{"id", "event": "started"} and {"id", "event": "result", "reward", "info"} or {..., "error"}.
The worker kills this process's group when the call ends; the worker's death ends it too (the parent
pid is no longer the worker's, OWNER_VARIABLE: seen even when a child the worker forked holds stdin open).
An agent's own prints go to stderr, so they cannot garble the events.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
import time
from typing import Any, TextIO

from grpo_dist.agent.config import load_agent

OWNER_VARIABLE = "GRPO_DIST_AGENT_OWNER"  # the pid of the process that started the host (agent/runner.py)


def check_result(value: Any) -> dict[str, Any]:
    """A finite float, or a dict with a finite "reward" (its other keys: the episode's info)."""
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        info = {k: v for k, v in value.items() if k != "reward"}
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return {"error": f"the agent returned {value!r}: a finite float or a dict with a finite \"reward\" is needed"}
    return {"reward": float(value), "info": json.loads(json.dumps(info, default=repr))}


async def play_episode(run: Any, spec: dict[str, Any], api_key: str, timeout_s: float,
                       http: Any) -> dict[str, Any]:
    """One agent under its deadline, with a client of its own (sharing the host's connection pool:
    a client with its own builds an SSL context, tens of milliseconds each)."""
    import openai

    client = openai.AsyncOpenAI(base_url=spec["base_url"], api_key=api_key, max_retries=0, timeout=timeout_s,
                                http_client=http)
    try:
        return check_result(await asyncio.wait_for(run(spec["task"], client), timeout_s))
    except asyncio.TimeoutError:
        return {"error": f"the agent did not return within agent.timeout_s={timeout_s:g}"}
    except Exception as exc:  # noqa: BLE001 - whatever the agent did costs its episode only
        return {"error": f"the agent raised {type(exc).__name__}: {exc}"}


def http_client() -> Any:
    """The agents' shared connection pool, built before the job comes (its SSL context costs 50-200 ms):
    openai's aiohttp transport (2 calls of 32 agents: 0.5-0.7 s against httpx's 0.7-1.0 s, loaded 2 cores)."""
    import openai

    return openai.DefaultAioHttpClient(trust_env=False)  # the endpoint is never behind a proxy


async def play(job: dict[str, Any], events: TextIO, http: Any) -> None:
    """Every episode of the job, in order, `concurrency` at once, their clients sharing `http`."""
    run, queue = load_agent(job["agent"]), list(job["episodes"])

    def emit(event: dict[str, Any]) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    async def slot() -> None:
        while queue:
            spec = queue.pop(0)
            emit({"id": spec["id"], "event": "started"})
            result = await play_episode(run, spec, job["api_key"], job["timeout_s"], http)
            emit({"id": spec["id"], "event": "result", **result})

    async with http:
        await asyncio.gather(*(slot() for _ in range(min(job["concurrency"], len(queue)) or 1)))


def _exit_when_owner_dies(owner: int) -> None:
    """Polls the parent pid: a killed worker (kill -9) ends its hosts even if stdin's pipe outlives it."""
    while os.getppid() == owner:
        time.sleep(0.5)
    os._exit(1)


def _exit_when_stdin_ends() -> None:
    sys.stdin.read()
    os._exit(1)


def main() -> None:
    owner = int(os.environ.get(OWNER_VARIABLE, os.getppid()))  # the owner's pid, even if it died while we started
    threading.Thread(target=_exit_when_owner_dies, args=(owner,), daemon=True).start()
    import openai  # noqa: F401 - imported (with the agent's module) before the job comes: a spare host is ready

    if len(sys.argv) > 1:
        load_agent(sys.argv[1])
    http = http_client()
    line = sys.stdin.readline()
    if not line:  # the worker ended before giving this spare host a job
        return
    job = json.loads(line)
    events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the agent's prints go to stderr
    threading.Thread(target=_exit_when_stdin_ends, daemon=True).start()
    asyncio.run(play(job, events, http))


if __name__ == "__main__":
    main()
