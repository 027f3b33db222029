"""The actors of a run: started in their placement groups, waited for, stopped; the learner's calls.

Rollout and reward actors are restarted by Ray when their process dies (recovery.py says how
the controller catches them up); the learner never is: `LearnerWatch` turns its death into
LearnerLost and an exception inside it into RunFailed, naming the stage and the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from grpo_dist.config.schema import Config, effective_reward
from grpo_dist.controller.errors import LearnerLost, NotPlaced, RunFailed
from grpo_dist.controller.placement import create_placement_group, roles, unplaced
from grpo_dist.controller.actor_classes import RewardWorker, RolloutWorker, start_learner, with_arguments
from grpo_dist.controller.cluster import passes_by_reference
from grpo_dist.common.waits import ActorLost, cause_line, fetch, first_line, timeout_error

if TYPE_CHECKING:  # the weights' modules import torch; this module is imported before the actors start
    from grpo_dist.weights import WeightSync

# Runtime environment of the rollout and reward actors on a joined cluster: every return value
# is put in the object store (the threshold under which Ray inlines it into the caller is 0
# bytes), so the driver holds references, never groups (pipeline.py). A local cluster has the
# setting everywhere already (cluster.LOCAL_SYSTEM_CONFIG says what that saves).
BY_REFERENCE = {"env_vars": {"RAY_max_direct_call_object_size": "0"}}


def actor_state(handle: Any) -> tuple[str, int]:
    """(state, restarts) of an actor in Ray's actor table: ALIVE, RESTARTING, DEAD, ...

    The table lives in Ray's GCS; reading it needs no dashboard and never waits behind the
    actor's own calls (ray.util.state would need the dashboard).
    """
    record = ray._private.state.actors(actor_id=handle._actor_id.hex())
    return record["State"], int(record["NumRestarts"])


@dataclass
class Actors:
    rollouts: list[Any]
    rewards: list[Any]
    learner: Any | None  # None for evaluation alone
    placements: dict[str, PlacementGroup]
    ready_s: dict[str, float] = field(default_factory=dict)  # each actor's seconds from create() until constructed
    started: float = field(default_factory=time.perf_counter)  # when create() began (perf_counter)

    @classmethod
    def start(cls, config: Config, learner: bool = True) -> Actors:
        """`create` every actor and wait until all are constructed (NotPlaced names what the
        cluster lacks)."""
        return cls.create(config, learner).wait_ready(config.cluster.actor_start_timeout_s)

    @classmethod
    def create(cls, config: Config, learner: bool = True) -> Actors:
        """Create every actor in a bundle of its role's placement group (placement.py), all at
        once, and return without waiting for them: their constructors (imports, model loads) run
        while the caller goes on, until `wait_ready`."""
        seed = config.trainer.seed
        clock = time.perf_counter()
        placed = {role.name: (role, create_placement_group(role))
                  for role in roles(config) if learner or role.name != "learner"}

        environment = {} if passes_by_reference() else {"runtime_env": BY_REFERENCE}

        def restartable(name: str, index: int, actor_class: type, *args: Any) -> Any:
            """Create the `index`th actor of role `name`, which Ray restarts when its process dies
            (and never runs a call of it again by itself: recovery.py says why); its constructor's
            arguments are bound into its class (actor_classes.with_arguments says why)."""
            role, group = placed[name]
            options = {**role.actor_options(group, index), **environment,
                       "max_restarts": config.cluster.max_restarts, "max_task_retries": 0}
            return ray.remote(with_arguments(actor_class, *args)).options(**options).remote()

        # Created in this order because a local cluster starts as many worker processes ahead as it
        # has CPUs (two on two cores) and the first actors take them: the engines and the learner
        # load a model, the reward actors nothing, so they can best afford to wait for a new one.
        rollouts = [restartable("rollout", index, RolloutWorker, config.model, config.rollout, seed * 1000 + index,
                                config.env, config.agent)
                    for index in range(config.rollout.num_workers)]
        learner_actor = start_learner(config, placement=placed["learner"][1]) if learner else None  # rank i in bundle i
        reward = effective_reward(config)
        rewards = [restartable("reward", index, RewardWorker, reward) for index in range(config.reward.num_workers)]
        actors = cls(rollouts=rollouts, rewards=rewards, learner=learner_actor,
                     placements={name: group for name, (_, group) in placed.items()})
        actors.started = clock
        return actors

    @property
    def every(self) -> list[Any]:
        return [*self.rollouts, *self.rewards, *([self.learner] if self.learner is not None else [])]

    def wait_ready(self, timeout_s: float) -> Actors:
        """Block until every actor is constructed (then return them); name the resources when
        some cannot be placed. `ready_s` gets each actor's seconds from `create` until it was."""
        names = ([f"rollout worker {i}: start" for i in range(len(self.rollouts))]
                 + [f"reward actor {i}: start" for i in range(len(self.rewards))]
                 + (["learner: start"] if self.learner is not None else []))
        clock = self.started
        refs = [actor.__ray_ready__.remote() for actor in self.every]
        pending, deadline = list(refs), time.perf_counter() + timeout_s
        while pending and time.perf_counter() < deadline:  # when each is ready; fetch below judges them
            done, pending = ray.wait(pending, timeout=max(deadline - time.perf_counter(), 0.0))
            for ref in done:
                self.ready_s[names[refs.index(ref)].removesuffix(": start")] = round(time.perf_counter() - clock, 3)
        if pending:
            late = timeout_error(refs, names, pending, timeout_s, limit="cluster.actor_start_timeout_s")
            waiting = unplaced(self.placements)
            self.stop()
            raise NotPlaced(
                f"{late}; placement groups not placed: {', '.join(waiting) or 'none'}; the cluster has "
                f"{ray.available_resources()} available of {ray.cluster_resources()}: lower the "
                "num_cpus/num_gpus/resources of rollout, reward and learner, drop node_labels no node carries, "
                "or add nodes")
        try:
            ray.get(refs)
        except ray.exceptions.RayError as failed:  # a constructor's exception
            self.stop()
            raise RunFailed(f"an actor failed to start: {cause_line(failed)}") from None
        return self

    def stop(self) -> None:
        """Let reward actors stop their scoring processes (briefly), then kill every actor."""
        ray.wait([reward.close.remote() for reward in self.rewards], num_returns=len(self.rewards), timeout=10)
        for actor in self.every:
            ray.kill(actor)
        for group in self.placements.values():
            remove_placement_group(group)


class LearnerWatch:
    """Waits on the learner's calls, at most trainer.call_timeout_s each. Its death is LearnerLost,
    an exception inside it RunFailed, both naming the stage and the step in progress."""

    def __init__(self, actor: Any, timeout_s: float, transport: WeightSync | None = None) -> None:
        """`transport`: the weights' (its export in flight is the learner's work: `check_exported`)."""
        self.actor, self.timeout_s, self.transport = actor, timeout_s, transport
        self.step = 0  # the step in progress, or the last one done (for the messages)

    def call(self, ref: ray.ObjectRef, stage: str) -> Any:
        try:
            return fetch([ref], [f"learner: {stage}"], self.timeout_s)[0]
        except ActorLost as lost:
            raise LearnerLost(f"the learner died during {stage} at step {self.step} ({first_line(lost)})") from None
        except ray.exceptions.RayTaskError as failed:
            raise RunFailed(f"the learner failed during {stage} at step {self.step}: {cause_line(failed)}") from None

    def check_alive(self) -> None:
        """LearnerLost when the learner's process is gone: a lost chunk or weight push may be its
        doing (the weights it was to export never came), and no revival of a rollout worker helps."""
        state, _ = actor_state(self.actor)
        if state == "DEAD":
            raise LearnerLost(f"the learner died at step {self.step} (its actor is DEAD)")

    def check_exported(self) -> None:
        """The learner's CallTimeout when its latest weight export (object store transport), which
        a rollout worker's load waits for, is not done within `timeout_s`: then a late rollout call
        is the frozen learner's doing, and killing the worker would not help (its restart waits on
        the same learner). A broadcast has no export of its own to wait on: nothing to check."""
        exported = self.transport.export_in_flight() if self.transport is not None else None
        if exported is not None:
            ready, _ = ray.wait([exported], timeout=self.timeout_s, fetch_local=False)
            if not ready:
                raise timeout_error([exported], ["learner: export_weights"], [exported], self.timeout_s)
