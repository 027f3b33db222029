"""env/base.py, registry.py and config.py: Steps are checked, environments load by name with
clear errors, and the `env` section is validated before Ray starts (exit 2 naming the field)."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from env_helpers import AsyncCountdown, Countdown
from grpo_dist.config.schema import ConfigError, load_config
from grpo_dist.tasks.data import DataError, prompt_token_limit
from grpo_dist.env import EnvError, Step
from grpo_dist.env.base import call, check_opening, check_step
from grpo_dist.env.config import EnvConfig
from grpo_dist.env.registry import load_environment

ROOT = Path(__file__).resolve().parent.parent


def test_environments_load_by_name_and_bad_names_say_why():
    assert load_environment("env_helpers:Countdown") is Countdown
    for name, message in [("nope", "neither a built-in environment"),
                          ("no_such_module:Env", "cannot import no_such_module"),
                          ("env_helpers:Missing", "has no 'Missing'"),
                          ("env_helpers:NotAnEnvironment", "not a subclass of grpo_dist.env.Environment")]:
        with pytest.raises(ValueError, match=message):
            load_environment(name)


def test_the_env_section_validates_every_field():
    config = EnvConfig(name="env_helpers:Countdown", kwargs={"turns": 2})
    assert (config.max_turns, config.history, config.concurrency, config.waves) == (4, "append", 32, 1)
    with pytest.raises(ValueError, match=r"env.kwargs \['bogus'\] do not fit Countdown"):
        EnvConfig(name="env_helpers:Countdown", kwargs={"bogus": 1})
    for field, value in [("max_turns", 0), ("max_observation_tokens", 0), ("concurrency", 0), ("waves", 0), ("history", "all"),
                         ("step_timeout_s", 0)]:
        with pytest.raises(ValueError, match=field):
            EnvConfig(name="env_helpers:Countdown", **{field: value})


ENV = ["env.name=env_helpers:Countdown", "reward.functions=[{name: env_reward}]", "reward.accuracy_from=env_reward"]


def test_a_config_with_an_env_names_the_field_and_refuses_what_training_cannot_do_yet():
    assert load_config(None).env is None
    assert load_config(None, ENV).env.name == "env_helpers:Countdown"
    assert load_config(None, [*ENV, "env.history=per_turn"]).env.history == "per_turn"
    with pytest.raises(ConfigError, match=r"env.name = 'env_helpers:NotAnEnvironment'.*not a subclass"):
        load_config(None, [*ENV, "env.name=env_helpers:NotAnEnvironment"])
    for overrides, message in [(ENV[:1], "has no env_reward: the environment's step rewards would be ignored"),
                               ([*ENV, "env.history=per_turn", "algo.minibatch_size=8"], "set algo.minibatch_size=null"),
                               ([*ENV, "algo.aggregation=constant"], "algo.aggregation=constant divides by"),
                               ([*ENV, "algo.overlong_buffer=0.2"], "set algo.overlong_buffer=null with env")]:
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
    with pytest.raises(DataError, match=r"env.max_episode_tokens=1024 \+ rollout.max_new_tokens=8 exceed the context "
                                        "of 64 tokens"):  # the default model's, found before Ray starts
        prompt_token_limit(load_config(None, ENV))
    assert prompt_token_limit(load_config(None, [*ENV, "env.max_episode_tokens=56"])) == 56
    result = subprocess.run([sys.executable, "-m", "grpo_dist.launch", "env.name=no_such_module:Env"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and "env.name" in result.stderr and "cannot import" in result.stderr
    assert "Ray" not in result.stderr + result.stdout  # nothing was started


def test_environment_deadlines_must_leave_a_rollout_call_time_to_generate():
    """A rollout call plays whole episodes: reset + env.max_turns steps, each up to env.step_timeout_s,
    must take less than trainer.call_timeout_s, or a slow environment reads as a hung worker."""
    assert load_config(None, [*ENV, "env.step_timeout_s=199", "env.max_turns=2"]).env.step_timeout_s == 199
    for overrides in (["env.step_timeout_s=200", "env.max_turns=2"], ["trainer.call_timeout_s=120"]):
        with pytest.raises(ConfigError, match=r"env.step_timeout_s=\S+ x \(env.max_turns=\d+ steps \+ 1 reset\) = "
                                              r"\S+ s of environment calls per episode, not less than "
                                              r"trainer.call_timeout_s=\S+ \(the bound on a rollout call"):
            load_config(None, [*ENV, *overrides])


def test_steps_and_openings_are_checked():
    assert check_step(Step(observation="ok", reward=1)) == Step(observation="ok", reward=1.0)
    assert check_step(Step(done=True)).observation == ""
    assert check_step(Step(observation=None, done=True)) == Step(observation="", done=True)  # nothing to append
    for bad, message in [({"observation": "x"}, "must return a Step"),
                         (Step(observation="x", reward=float("nan")), "finite number"),
                         (Step(observation="x", reward=True), "finite number"),
                         (Step(observation="x", done=1), "must be a bool"),
                         (Step(observation=[{"role": "user"}]), r"Step.observation\[0\]"),
                         (Step(observation=""), "empty but the episode is not done"),
                         (Step(observation=None), "None but the episode is not done"),
                         (Step(observation="x", info=None), "info must be a dict")]:
        with pytest.raises(EnvError, match=message):
            check_step(bad)
    assert check_opening("hi") == "hi"
    with pytest.raises(EnvError, match="no messages"):
        check_opening([])
    with pytest.raises(EnvError, match="list of messages or a string"):
        check_opening(3)


def test_sync_and_async_methods_are_both_awaited():
    async def both():
        sync, asynchronous = Countdown(turns=2), AsyncCountdown(turns=2)
        row = {"prompt": "p", "answer": "4"}
        return [await call(env.reset, row) for env in (sync, asynchronous)], \
            [await call(env.step, "it is 4") for env in (sync, asynchronous)]

    openings, steps = asyncio.run(both())
    assert openings[0] == openings[1] == [{"role": "user", "content": "p"}]
    assert steps[0] == steps[1] == Step(observation=[{"role": "user", "content": "1 left"}], reward=1.0)
