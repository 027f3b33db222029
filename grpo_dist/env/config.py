"""The `env` section: multi-turn episodes (docs/multiturn.md). `env: null` is single-turn."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from grpo_dist.env.registry import check_env_options, load_environment
from grpo_dist.run_config import Section


class EnvConfig(Section):
    name: str = Field(description="built-in environment name or package.module:Class (an Environment subclass)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the environment's "
                                   "constructor (one instance per episode)")
    max_turns: int = Field(4, ge=1, description="model replies per episode at most")
    max_episode_tokens: int = Field(1024, ge=2, description="prompt + every turn, in tokens; an episode that "
                                    "reaches it ends (stop reason max_episode_tokens)")
    max_observation_tokens: int = Field(256, ge=1, description="an observation's content longer than this is cut "
                                        "to it (counted in env/observation_truncated)")
    concurrency: int = Field(32, ge=1, description="environment calls (reset, step) running at once per worker")
    step_timeout_s: float = Field(30.0, gt=0, description="deadline of one reset or step; past it the episode fails")
    history: Literal["append", "per_turn"] = Field(
        "append", description="append: one sample per episode, the turns appended token for token (a template "
        "that rewrites history ends the episode: history_rewritten); per_turn: one sample per turn, each "
        "turn's context rendered afresh by the chat template"
    )

    @field_validator("name")
    @classmethod
    def _importable(cls, value: str) -> str:
        load_environment(value)
        return value

    @model_validator(mode="after")
    def _options_fit_the_environment(self) -> EnvConfig:
        check_env_options(self.name, self.kwargs)
        return self


def refuse_until_wired(env: EnvConfig) -> EnvConfig:
    """Training runs do not run episodes yet (the runner is not in the rollout worker): refuse
    rather than silently train single-turn."""
    raise ValueError(f"multi-turn training is not yet wired: env.name={env.name!r} is valid, but the rollout "
                     "worker does not run episodes yet (docs/multiturn.md says what is in place); set env: null")


# The type of Config.env: a valid section that training refuses until the pipeline runs episodes.
TrainingEnv = Annotated[EnvConfig, AfterValidator(refuse_until_wired)]
