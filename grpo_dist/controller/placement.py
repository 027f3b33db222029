"""Placement groups: where every actor kind lands on the cluster.

Each role (rollout workers, reward actors, the learner) gets a placement group built from
its config section: one bundle per actor holding the CPUs, GPUs and custom `resources` the
section asks for, placed with the section's strategy (PACK: on as few nodes as fit; SPREAD:
on as many nodes as possible), and, when the section sets `node_labels`, only on nodes that
carry those labels. Custom resources and labels are how roles are pinned to node types:
start GPU nodes with `--resources '{"engine_node": 8}'` or `--labels pool=gpu` and ask for
them in `rollout.resources` / `rollout.node_labels`.

A rollout worker's bundle holds all the GPUs of its engine (`rollout.num_gpus`, equal to
`rollout.vllm.tensor_parallel_size`), so a tensor-parallel engine sits on one node.
Fractional GPUs (`learner.num_gpus: 0.5`, `rollout.num_gpus: 0.5`) let the learner and an
engine share a GPU when their bundles land on the same node (a one-GPU node, or pinned there
by a resource or label): Ray hands fractional GPUs out first-fit, so both get GPU 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_dist.config.schema import Config
from grpo_dist.controller.errors import StartError


@dataclass(frozen=True)
class Role:
    """One actor kind's placement: `count` bundles of `resources`, with a strategy and labels."""

    name: str
    count: int
    num_cpus: float
    num_gpus: float
    custom: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    strategy: str = "pack"

    def bundle(self) -> dict[str, float]:
        """What one actor reserves (Ray refuses zero amounts in a bundle)."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.custom}
        return {name: amount for name, amount in wanted.items() if amount > 0}

    def actor_options(self, group: PlacementGroup, index: int) -> dict:
        """`.options(...)` for the actor in bundle `index`: it asks for exactly its bundle."""
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.custom),
                "scheduling_strategy": in_bundle(group, index)}


def roles(config: Config) -> list[Role]:
    """The roles of a run, from the rollout, reward and learner sections."""
    rollout, reward, learner = config.rollout, config.reward, config.learner
    return [
        Role("rollout", rollout.num_workers, rollout.num_cpus, rollout.num_gpus, rollout.resources,
             rollout.node_labels, rollout.placement),
        Role("reward", reward.num_workers, reward.num_cpus, reward.num_gpus, reward.resources,
             reward.node_labels, reward.placement),
        Role("learner", learner.num_ranks, learner.num_cpus, learner.num_gpus, learner.resources, learner.node_labels),
    ]


def required_resources(config: Config) -> dict[str, float]:
    """What the run's actors reserve together, per resource (CPU, GPU, custom)."""
    total: dict[str, float] = {"CPU": 0.0}
    for role in roles(config):
        for name, amount in role.bundle().items():
            total[name] = total.get(name, 0.0) + amount * role.count
    return total


def check_capacity(config: Config, cluster: dict[str, float]) -> None:
    """StartError, in one line, when the cluster (`ray.cluster_resources()`) has less of a
    resource in all than the run's actors reserve: they could never all be placed."""
    short = {name: amount for name, amount in required_resources(config).items()
             if amount > cluster.get(name, 0.0) + 1e-9}
    if not short:
        return
    asks = "; ".join(f"{role.name} {role.count} x {role.bundle()}" for role in roles(config))
    lacking = ", ".join(f"{name} {amount:g} (the cluster has {cluster.get(name, 0.0):g})"
                        for name, amount in short.items())
    raise StartError(f"the cluster cannot hold this run: its actors reserve {lacking}; they ask for {asks}: lower "
                     "rollout/reward/learner num_workers, num_ranks, num_cpus, num_gpus or resources, set "
                     "cluster.num_cpus for a local cluster, or add nodes")


def create_placement_group(role: Role) -> PlacementGroup:
    """Reserve the role's bundles (placed asynchronously; `group.ready()` tells when)."""
    labels = [dict(role.labels)] * role.count if role.labels else None
    return placement_group([role.bundle()] * role.count, strategy=role.strategy.upper(),
                           name=f"grpo_dist/{role.name}", bundle_label_selector=labels)


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    """Schedule an actor into bundle `index` of `group`."""
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def unplaced(groups: dict[str, PlacementGroup]) -> list[str]:
    """The roles whose placement group the cluster has not placed (yet)."""
    return [name for name, group in groups.items() if placement_group_table(group).get("state") != "CREATED"]
