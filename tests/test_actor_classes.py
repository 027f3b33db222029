"""The actors' classes as the driver creates them (controller/actor_classes.py): the real classes'
methods, no heavy import in the driver, the real object built in the actor's process."""

import json
import os
import signal
import subprocess
import sys

import pytest
import ray

from grpo_dist.config.schema import effective_reward, load_config
from grpo_dist.controller import actor_classes
from grpo_dist.controller.actors import Actors, actor_state
from grpo_dist.controller.cluster import connect_ray, passes_by_reference, shutdown_ray
from grpo_dist.learner.group import LearnerGroup
from grpo_dist.learner.worker import Learner
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.rollout.worker import RolloutWorker
from faults import wait_alive
from test_reward_worker import group

REAL = {"RolloutWorker": RolloutWorker, "RewardWorker": RewardWorker, "Learner": Learner, "LearnerGroup": LearnerGroup}


def public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


@pytest.mark.parametrize("name", sorted(REAL))
def test_each_class_offers_exactly_the_real_classes_public_methods(name):
    forwarding = getattr(actor_classes, name)
    assert forwarding.__name__ == name
    assert public_methods(forwarding) == public_methods(REAL[name])


def test_a_method_missing_from_a_list_is_seen():
    trimmed = actor_classes.forwarding_class("grpo_dist.rollout.worker", "RolloutWorker", ("generate",))
    assert public_methods(RolloutWorker) - public_methods(trimmed) == public_methods(RolloutWorker) - {"generate"}


def imported_by(modules: str, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter has in sys.modules after importing `modules`."""
    code = f"import json, sys, {modules}; print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    return json.loads(out)


def test_the_driver_creates_the_actors_without_importing_torch_or_transformers():
    """launch creates the actors as soon as Ray is up; with torch imported first it would wait seconds."""
    assert imported_by("grpo_dist.controller.actors, grpo_dist.controller.actor_classes",
                       ("torch", "transformers", "vllm")) == []


def test_a_rollout_worker_without_an_agent_does_not_import_the_agents_http_stack():
    """aiohttp and the agent's runner cost a rollout actor 0.12 s at start; only an agent's job needs them."""
    assert imported_by("grpo_dist.rollout.worker", ("aiohttp", "grpo_dist.agent.runner")) == []


@pytest.mark.ray
def test_the_real_object_is_built_and_called_in_the_actors_process():
    """A forwarding RewardWorker scores as the real one does: the default job's reward, by hand."""
    config = load_config(None, [])
    answers = group(["<answer>125</answer>", "<answer>115</answer>", "125"], answer="125")
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        reward = ray.remote(actor_classes.RewardWorker).options(num_cpus=1).remote(effective_reward(config))
        scored, _ = ray.get(reward.score.remote([answers]))
        ray.get(reward.close.remote())
    finally:
        ray.shutdown()
    assert scored[0].rewards == RewardWorker(effective_reward(config)).score([answers])[0][0].rewards
    assert scored[0].reward_parts["exact_answer"] == [1.0, 0.0, 0.0]


@pytest.mark.ray
def test_on_the_local_cluster_launch_starts_results_stay_out_of_the_driver_and_actors_survive_restarts(ray_stopped):
    """Launch's local cluster puts every result in the object store (cluster.LOCAL_SYSTEM_CONFIG),
    so its actors need no runtime environment; every argument goes there too, and Ray drops a
    creation task's arguments once the actor is created: a reward actor killed three times must
    come back and score each time, its constructor's arguments bound into its class (with_arguments)."""
    config = load_config(None, ["cluster.address=local"])
    answers = group(["<answer>125</answer>", "<answer>115</answer>"], answer="125")
    connect_ray(config, None)
    try:
        assert passes_by_reference()
        actors = Actors.create(config, learner=False)
        reward = actors.rewards[0]
        ray.get(reward.__ray_ready__.remote())
        core_worker = ray._private.worker.global_worker.core_worker
        for restart in range(3):
            before = core_worker.get_local_memory_store_bytes_used()
            done = reward.score.remote([answers])
            ray.wait([done], timeout=60)
            # (a result inlined into the driver would stay in its store while `done` lives; an earlier
            # reference's entry may be freed meanwhile, so the store may shrink)
            assert core_worker.get_local_memory_store_bytes_used() <= before, f"inlined into the driver ({restart})"
            assert ray.get(done)[0][0].reward_parts["exact_answer"] == [1.0, 0.0]
            pid = ray.get(reward.__ray_call__.remote(lambda _: os.getpid()))
            os.kill(pid, signal.SIGKILL)
            wait_alive(reward, restarts=restart + 1)
        assert ray.get(reward.score.remote([answers]))[0][0].reward_parts["exact_answer"] == [1.0, 0.0]
        assert actor_state(reward) == ("ALIVE", 3)
        actors.stop()
    finally:
        shutdown_ray()
