"""Placement groups: where the rollout workers land on the cluster.

One bundle per rollout worker, holding the CPUs and GPUs its config asks for. PACK puts
the bundles on as few nodes as fit (engines share a node, close to the learner); SPREAD
puts them on as many nodes as possible (one engine per node where there are enough).
"""

from __future__ import annotations

from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_dist.config import RolloutConfig


def rollout_placement_group(rollout: RolloutConfig) -> PlacementGroup:
    """Reserve `rollout.num_workers` bundles with the configured strategy (placed asynchronously)."""
    bundle = {name: amount for name, amount in (("CPU", rollout.num_cpus), ("GPU", rollout.num_gpus)) if amount > 0}
    return placement_group([bundle] * rollout.num_workers, strategy=rollout.placement.upper())


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    """Schedule an actor into bundle `index` of `group`."""
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)
