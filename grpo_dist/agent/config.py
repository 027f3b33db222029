"""The `agent` section: episodes played by the user's own OpenAI-API agent code (docs/agents.md).
`agent: null` (the default) plays none; `agent` and `env` exclude each other."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_dist.agent.tool_calls import check_pattern
from grpo_dist.env.config import EpisodeLimits


class AgentConfig(EpisodeLimits):
    name: str = Field(description="package.module:function, an `async def run(task: dict, client)` returning the "
                      "reward (a float, or a dict with \"reward\"); client: an openai.AsyncOpenAI pointed at the "
                      "episode's endpoint")
    concurrency: int = Field(32, ge=1, description="agents running at once per rollout worker")
    timeout_s: float = Field(60.0, gt=0, description="an episode's deadline, from its start (enforced even when "
                             "the agent blocks its event loop); past it the episode fails")
    tool_parser: Literal["hermes", "llama3_json", "regex"] = Field(
        "hermes", description="how tool calls are read from the model's reply (docs/agents.md)")
    tool_call_regex: str | None = Field(None, description="tool_parser=regex: the pattern of one call")
    host: str = Field("127.0.0.1", description="the endpoint's address: 127.0.0.1 (agents on this machine), or "
                      "node (the node's IP, for agents elsewhere in the cluster)")
    max_request_bytes: int = Field(4_000_000, ge=1024, description="a request body larger than this gets 413")

    @field_validator("name")
    @classmethod
    def _an_async_function(cls, value: str) -> str:
        load_agent(value)
        return value

    @model_validator(mode="after")
    def _a_regex_parser_has_its_pattern(self) -> AgentConfig:
        if self.tool_parser == "regex":
            if self.tool_call_regex is None:
                raise ValueError("agent.tool_parser=regex needs agent.tool_call_regex (the pattern of one call)")
            check_pattern(self.tool_call_regex)
        return self


def load_agent(name: str) -> Callable[..., Any]:
    """The `async def` named "package.module:function"; a one-line ValueError otherwise."""
    module_name, _, function_name = name.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"agent.name={name!r} must be package.module:function")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"agent.name={name!r} cannot be imported: {exc}") from None
    if not inspect.iscoroutinefunction(function):
        raise ValueError(f"agent.name={name!r} is not an async def run(task, client)")
    return function


HOST_START_S = 30.0  # allowed for the agent host process to start (python, openai, the agent's module)


def call_deadline_s(agent: AgentConfig, episodes: int) -> float:
    """How long a rollout call of `episodes` agent episodes may take: the host's start, then
    agent.timeout_s for each batch of agent.concurrency episodes."""
    return HOST_START_S + agent.timeout_s * math.ceil(episodes / agent.concurrency)


def check_agent_deadline(agent: AgentConfig | None, call_timeout_s: float, rollout: Any) -> None:
    """A rollout call's agent episodes (call_deadline_s; `rollout` the rollout section) must end within
    trainer.call_timeout_s, the bound on that call past which the worker counts as hung; agent=None passes."""
    episodes_per_call = min(rollout.chunk_prompts, rollout.prompts_per_step) * rollout.group_size
    if agent is not None and call_deadline_s(agent, episodes_per_call) >= call_timeout_s:
        raise ValueError(
            f"{episodes_per_call} agent episodes per rollout call (rollout.chunk_prompts x group_size), "
            f"agent.concurrency={agent.concurrency} at once, each up to agent.timeout_s={agent.timeout_s:g}, plus "
            f"{HOST_START_S:g} s to start the agents' process, is not less than trainer.call_timeout_s="
            f"{call_timeout_s:g}: lower agent.timeout_s, raise agent.concurrency or trainer.call_timeout_s")
