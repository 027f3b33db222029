"""Agents written for the agent tests (tests/test_agent_*.py): well-behaved ones and the failures
an episode must absorb, and an engine wrapper that records what the engine returned."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import openai

from grpo_dist.common.types import Completion, SamplingSettings


async def two_turns(task: dict[str, Any], client: Any) -> dict[str, Any]:
    """Asks, sends a tool result and a user message after the reply, asks again; reward 1. Keeps
    what it saw of each reply (the logprobs' tokens) in its info."""
    messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
    seen = []
    for follow_up in ([{"role": "tool", "tool_call_id": "call_0", "content": "42"},
                       {"role": "user", "content": "Again?"}], []):
        reply = await client.chat.completions.create(model="policy", messages=messages, logprobs=True)
        messages.append(reply.choices[0].message)
        seen.append([t.token for t in reply.choices[0].logprobs.content])
        messages += follow_up
    return {"reward": 1.0, "seen": seen}


async def probe(task: dict[str, Any], client: Any) -> dict[str, Any]:
    """Asks for more tokens than the config allows (400), then asks properly; notes the statuses."""
    statuses = []
    try:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=10_000)
    except openai.APIStatusError as exc:
        statuses.append(exc.status_code)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return {"reward": 0.5, "statuses": statuses, "base_url": str(client.base_url)}


async def misbehave(task: dict[str, Any], client: Any) -> Any:
    """What task["mode"] says: a good episode, or one of the failures."""
    mode = task["mode"]
    if mode == "never_calls":
        return 1.0
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    if mode == "raises":
        raise RuntimeError("the agent's own bug")
    if mode == "nan":
        return float("nan")
    if mode == "rewrites":
        try:
            await client.chat.completions.create(model="policy", messages=[
                {"role": "user", "content": "hi"}, {"role": "assistant", "content": "something else"},
                {"role": "user", "content": "and?"}])
        except openai.BadRequestError:
            pass
        return 0.25
    return {"reward": 1.0, "reply": reply.choices[0].message.content}


async def blocks(task: dict[str, Any], client: Any) -> float:
    """Blocks its event loop (a sync sleep) after its first request: only a deadline outside it stops it."""
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    time.sleep(3600)
    return 1.0


async def exits(task: dict[str, Any], client: Any) -> float:
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    os._exit(3)


async def sleeps(task: dict[str, Any], client: Any) -> float:
    await asyncio.sleep(3600)
    return 1.0


class Recording:
    """An engine that records each call's inputs and outputs (the real engine underneath)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, []

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings,
                 seeds: list[int]) -> list[list[Completion]]:
        outputs = self.engine.generate(prompt_ids, sampling, seeds)
        self.calls.append((prompt_ids, outputs))
        return outputs


class Scripted:
    """An engine whose replies are given ids (a constructed reply, the real tokenizer's ids),
    logprob -1 each: for token bookkeeping that must not depend on sampling."""

    def __init__(self, replies: list[list[int]]) -> None:
        self.replies, self.inputs = replies, []

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings,
                 seeds: list[int]) -> list[list[Completion]]:
        reply = self.replies[min(len(self.inputs), len(self.replies) - 1)]  # one per call: per turn
        self.inputs.append(prompt_ids)
        return [[Completion(list(reply), [-1.0] * len(reply), "", "stop")] for _ in prompt_ids]


def mask_runs(ids: list[int], mask: list[int], value: int) -> list[list[int]]:
    """The maximal runs of `ids` whose mask is `value`, in order."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask)):
        if m == value:
            if i == 0 or mask[i - 1] != value:
                runs.append([])
            runs[-1].append(token)
    return runs
