"""The `env` section: multi-turn episodes (docs/multiturn.md). `env: null` is single-turn."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_dist.env.registry import check_env_options, load_environment
from grpo_dist.config.run import Section


class EpisodeLimits(Section):
    """What bounds an episode's tokens and turns, shared by the `env` and `agent` sections."""

    max_turns: int = Field(4, ge=1, description="model replies per episode at most")
    max_episode_tokens: int = Field(1024, ge=2, description="prompt + every turn, in tokens; an episode that "
                                    "reaches it ends (stop reason max_episode_tokens)")
    max_observation_tokens: int = Field(256, ge=1, description="an observation's content longer than this is cut "
                                        "to it (counted in env/observation_truncated)")
    history: Literal["append", "per_turn"] = Field(
        "append", description="append: one sample per episode, the turns appended token for token (a template "
        "that rewrites history ends the episode: history_rewritten); per_turn: one sample per turn, each "
        "turn's context rendered afresh by the chat template, each with the episode's advantage"
    )


class EnvConfig(EpisodeLimits):
    name: str = Field(description="built-in environment name or package.module:Class (an Environment subclass)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the environment's "
                                   "constructor (one instance per episode)")
    concurrency: int = Field(32, ge=1, description="environment calls (reset, step) running at once per worker")
    waves: int = Field(1, ge=1, description="the episodes of a chunk split into this many fixed waves that take "
                       "turns on the engine, one wave's environment steps running while another generates; 1: "
                       "every active episode in one engine call per round (largest batches, steps not overlapped)")
    step_timeout_s: float = Field(30.0, gt=0, description="deadline of one reset or step (sync or async, even one "
                                  "that blocks its event loop); past it the episode fails. step_timeout_s x "
                                  "(max_turns + 1) must be less than trainer.call_timeout_s")

    @field_validator("name")
    @classmethod
    def _importable(cls, value: str) -> str:
        load_environment(value)
        return value

    @model_validator(mode="after")
    def _options_fit_the_environment(self) -> EnvConfig:
        check_env_options(self.name, self.kwargs)
        return self


def check_training_env(env: EpisodeLimits | None, reward_names: list[str], aggregation: str, overlong: bool,
                       minibatch_size: int | None, section: str = "env") -> None:
    """What a training run with episodes (the `env` or `agent` section, named `section`) cannot do
    yet, refused before anything starts (each message names the fields); env=None passes."""
    if env is None:
        return
    if env.history == "per_turn" and minibatch_size is not None:
        raise ValueError(f"{section}.history=per_turn trains one row per turn, so algo.minibatch_size (in "
                         "completions) cannot split the batch: set algo.minibatch_size=null")
    if "env_reward" not in reward_names:
        raise ValueError(f"{section} is set but reward.functions {reward_names} has no env_reward: the "
                         "environment's step rewards would be ignored; add {name: env_reward} (weight 0 to log them only)")
    if aggregation == "constant":
        raise ValueError("algo.aggregation=constant divides by rollout.max_new_tokens, one turn's limit, not an "
                         "episode's: use token_mean or sequence_mean with " + section)
    if overlong:
        raise ValueError("algo.overlong_buffer's length penalty is of rollout.max_new_tokens, one turn's limit, not "
                         f"an episode's: set algo.overlong_buffer=null with {section} (max_episode_tokens ends long episodes)")


def check_env_deadlines(env: EnvConfig | None, call_timeout_s: float) -> None:
    """A rollout call plays whole episodes: their reset and steps, each waited for at most
    env.step_timeout_s, must end well within trainer.call_timeout_s (the bound on that call, past
    which the worker counts as hung), leaving time to generate; env=None passes."""
    if env is None:
        return
    calls_s = env.step_timeout_s * (env.max_turns + 1)
    if calls_s >= call_timeout_s:
        raise ValueError(
            f"env.step_timeout_s={env.step_timeout_s:g} x (env.max_turns={env.max_turns} steps + 1 reset) = "
            f"{calls_s:g} s of environment calls per episode, not less than trainer.call_timeout_s={call_timeout_s:g} "
            "(the bound on a rollout call, generation included): lower env.step_timeout_s or env.max_turns, or "
            "raise trainer.call_timeout_s")
