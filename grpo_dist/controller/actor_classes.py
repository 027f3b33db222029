"""The actors' classes as the driver creates them: without importing their modules.

`ray.remote(cls)` needs the class, and the modules of RolloutWorker and Learner import torch,
transformers and the engines: seconds on a 2-core machine, which the driver would pay before it
could create a single actor. Each class here has the real one's name and public methods; its
constructor imports the real module in the actor's own process, builds the real object, and each
method calls it. So `launch` creates the actors the moment Ray is up, and they import and load
while the driver imports the rest of the trainer. tests/test_actor_classes.py holds each list of
methods to its class's public methods (a method added there and not here fails it).

`with_arguments(cls, ...)` binds a class's constructor arguments into a subclass, so that they
travel with the class's definition rather than as the creation task's arguments (see there).

`start_learner(config)` creates the learner a run talks to: one Learner, or a LearnerGroup of
`learner.num_ranks` Learner ranks (learner/group.py).
"""

from __future__ import annotations

import importlib
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup

from grpo_dist.config.schema import Config
from grpo_dist.controller.placement import in_bundle


def forwarding_class(module: str, name: str, methods: tuple[str, ...]) -> type:
    """A class named `name` whose instances hold a `module.name` built with their constructor's
    arguments (the module imported then, where the instance lives) and pass `methods` to it."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        self.target = getattr(importlib.import_module(module), name)(*args, **kwargs)

    def forward(method: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.target, method)(*args, **kwargs)

        call.__name__ = call.__qualname__ = method
        call.__doc__ = f"{module}.{name}.{method}, in the actor's process."
        return call

    namespace = {"__init__": __init__, "__module__": __name__,
                 "__doc__": f"{module}.{name}, built in the actor's process (as `self.target`).",
                 **{method: forward(method) for method in methods}}
    return type(name, (), namespace)


def with_arguments(cls: type, *args: Any, **kwargs: Any) -> type:
    """A subclass of `cls`, of the same name, whose constructor takes no arguments and calls cls's
    with `args` and `kwargs`.

    Ray keeps an actor class's definition in its GCS for as long as the cluster lives, and builds
    a restarted actor from it; the creation task's arguments it keeps only as long as references
    to them live, and on a cluster that puts every argument in the object store (a local one,
    cluster.py) it drops them once the actor is created: the second restart of an actor then fails
    (ReferenceCountingAssertionError, ray-project/ray#53727). Bound here, they cannot be lost.
    """

    def __init__(self: Any) -> None:
        cls.__init__(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__doc__": cls.__doc__})


RolloutWorker = forwarding_class("grpo_dist.rollout.worker", "RolloutWorker", (
    "generate", "generate_chunk", "load_weights", "join_weight_group", "leave_weight_group", "receive_weights",
    "checksum", "policy_version", "describe"))
RewardWorker = forwarding_class("grpo_dist.reward.worker", "RewardWorker", (
    "score", "score_chunk", "score_for_evaluation", "outcomes", "inline_outcomes", "batched_outcomes",
    "scoring_pool", "close"))
_LEARNER_AND_GROUP = ("train_step", "logprobs", "export_weights", "checksum", "weight_group_address",
                      "join_weight_group", "weight_plan", "send_weights", "leave_weight_group", "save_state",
                      "load_state", "write_probe", "save")
Learner = forwarding_class("grpo_dist.learner.worker", "Learner", (
    *_LEARNER_AND_GROUP, "learn_chunk", "finish_step", "join_ranks"))
LearnerGroup = forwarding_class("grpo_dist.learner.group", "LearnerGroup", (*_LEARNER_AND_GROUP, "call", "close"))


def start_learner(config: Config, placement: PlacementGroup | None = None) -> Any:
    """The learner actor for `config`: one Learner, or a LearnerGroup over learner.num_ranks ranks.

    `placement`, when given, holds `learner_bundles(config.learner)` (learner/group.py): the learner
    (rank i) goes into bundle i; otherwise a single learner is placed freely and a group makes its own.
    """
    learner = config.learner
    args = (config.model, config.algo, learner, config.rollout, config.trainer.seed, config.trainer.steps)
    if learner.num_ranks > 1:
        return ray.remote(LearnerGroup).options(num_cpus=0).remote(*args, placement=placement,
                                                                   timeout_s=config.trainer.call_timeout_s)
    where = {} if placement is None else {"scheduling_strategy": in_bundle(placement, 0)}
    return ray.remote(Learner).options(num_cpus=learner.num_cpus, num_gpus=learner.num_gpus, **where).remote(*args)
