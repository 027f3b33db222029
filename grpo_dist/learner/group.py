"""Several learner ranks that the controller uses as one learner.

`start_learner(config)` (controller/actor_classes.py) returns the actor the controller talks to: a
`Learner` when `learner.num_ranks` is 1, else a `LearnerGroup`, an actor of its own (no CPUs) that starts
K `Learner` ranks in one placement group (a bundle of learner.num_cpus / num_gpus each,
packed), joins them into one data-parallel group (distributed.py: gloo on CPUs, NCCL on
GPUs) and offers the Learner's methods:

- train_step(*chunks, max_groups): every rank gets the whole batch (one object-store copy) and trains
  on its share; the metrics are rank 0's (already summed over ranks), the peak memory the
  largest of any rank.
- checksum: every rank's, which must agree (every rank holds the same weights).
- every other Learner method as `ROUTES` says: rank 0 alone, or every rank (rank 0's
  result); with learner.sharding=fsdp as `SHARDED_ROUTES` says (every method that reads the
  whole policy runs on every rank: it gathers shards). A public Learner method that is neither routed nor defined here (nor the group's
  own, `join_ranks`) is an error when this module is imported.
- close(): ends the ranks and the placement group the group made.

Every wait on a rank is bounded by `timeout_s` (trainer.call_timeout_s); past it CallTimeout
names the ranks and the method.

Ray ties a placement group to the job, not to the actor that made it: killing the group
ends its ranks, but the placement group it made stays reserved until close() or the end of
the driver. A controller that reserves placement groups itself passes the learner's
(`learner_bundles`) to `start_learner` and removes it. For export_weights the weights pass
through the group's process once more than with a single learner; the NCCL weight sync
sends from rank 0 directly.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from grpo_dist.config.schema import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig
from grpo_dist.learner.worker import Learner
from grpo_dist.common.waits import ActorLost, fetch
from grpo_dist.controller.placement import in_bundle
from grpo_dist.common.types import Group

Route = Literal["rank 0", "every rank"]

# Where the group runs each Learner method that it passes on unchanged. Rank 0 alone where
# one copy of the weights is enough (the ranks hold the same ones: checksum checks it) or
# where one writer is wanted; every rank where each rank's own state changes.
ROUTES: dict[str, Route] = {
    "logprobs": "rank 0",
    "export_weights": "rank 0",
    "weight_group_address": "rank 0",
    "join_weight_group": "rank 0",
    "weight_plan": "rank 0",
    "send_weights": "rank 0",
    "leave_weight_group": "rank 0",
    "save": "rank 0",
    "save_state": "rank 0",
    "write_probe": "rank 0",
    "load_state": "every rank",
}
# With learner.sharding=fsdp each rank holds a shard: whatever reads the whole policy is a
# collective that every rank must join (rank 0 alone sends, writes and answers).
SHARDED_ROUTES: dict[str, Route] = {**ROUTES, **dict.fromkeys(
    ("logprobs", "export_weights", "send_weights", "save", "save_state"), "every rank")}
GROUP_ONLY = {"join_ranks"}  # the group joins its ranks itself; the controller never calls it
# An overlapped sync step (controller/overlap.py) runs on one rank only; with several the controller calls train_step.
ONE_RANK_ONLY = {"learn_chunk", "finish_step"}


def learner_bundles(learner: LearnerConfig) -> list[dict[str, float]]:
    """One placement-group bundle per rank: its CPUs and GPUs."""
    bundle = {name: amount for name, amount in (("CPU", learner.num_cpus), ("GPU", learner.num_gpus)) if amount}
    return [bundle] * learner.num_ranks


# How long an exception in one rank waits for news of a dead peer: a rank killed in a
# collective makes its peers' gloo raise "Connection reset by peer" before Ray reports the death.
PEER_DEATH_GRACE_S = 5.0


def gather(futures: list[ray.ObjectRef], method: str, timeout_s: float) -> list[Any]:
    """Every rank's result of `method`, in order; the first failure raises as soon as it is known
    (not after the others: its peers may be blocked in a collective), and CallTimeout names the
    ranks not done after `timeout_s`. An exception in a rank whose peer died raises the death
    instead (`dead_peer`): that is the cause, the exception its echo."""
    names = [f"learner rank {rank}: {method}" for rank in range(len(futures))]
    try:
        return fetch(futures, names, timeout_s, fail_fast=True)
    except ActorLost:
        raise
    except ray.exceptions.RayTaskError as failed:
        raise dead_peer(futures, PEER_DEATH_GRACE_S) or failed from None


def dead_peer(futures: list[ray.ObjectRef], grace_s: float) -> ActorLost | None:
    """The ActorLost error of the first of `futures` whose actor is found dead within `grace_s`, else None."""
    deadline, pending = time.monotonic() + grace_s, list(futures)
    while pending:
        done, pending = ray.wait(pending, timeout=max(0.0, deadline - time.monotonic()), fetch_local=False)
        if not done:
            return None
        try:
            ray.get(done)
        except ActorLost as lost:
            return lost
        except ray.exceptions.RayTaskError:
            pass
    return None


class LearnerGroup:
    """Runs as a Ray actor (see `start_learner`): K Learner ranks behind the Learner's interface."""

    def __init__(self, model: ModelConfig, algo: AlgoConfig, learner: LearnerConfig, rollout: RolloutConfig,
                 seed: int, total_steps: int | None = None, placement: PlacementGroup | None = None,
                 timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self.routes = SHARDED_ROUTES if learner.sharding == "fsdp" else ROUTES
        self.owns_placement = placement is None
        self.placement = placement or placement_group(learner_bundles(learner), strategy="PACK")
        rank_cls = ray.remote(Learner)
        self.ranks = [
            rank_cls.options(num_cpus=learner.num_cpus, num_gpus=learner.num_gpus,
                             scheduling_strategy=in_bundle(self.placement, index)
                             ).remote(model, algo, learner, rollout, seed, total_steps)
            for index in range(learner.num_ranks)
        ]
        host, port = self.call("weight_group_address", "rank 0")
        gather([rank.join_ranks.remote(host, port, index, len(self.ranks)) for index, rank in enumerate(self.ranks)],
               "join_ranks", timeout_s)

    def call(self, method: str, route: Route, *args: Any, **kwargs: Any) -> Any:
        """The ranks' `method(*args, **kwargs)` as `route` says, rank 0's result, waited for at most timeout_s."""
        if route == "rank 0":
            ref = getattr(self.ranks[0], method).remote(*args, **kwargs)
            return fetch([ref], [f"learner rank 0: {method}"], self.timeout_s)[0]
        futures = [getattr(rank, method).remote(*args, **kwargs) for rank in self.ranks]
        return gather(futures, method, self.timeout_s)[0]

    def train_step(self, *chunks: list[Group], max_groups: int | None = None) -> dict[str, float]:
        groups = ray.put([group for chunk in chunks for group in chunk][:max_groups])
        metrics = gather([rank.train_step.remote(groups) for rank in self.ranks], "train_step", self.timeout_s)
        peak = max(m["system/learner_peak_memory_mb"] for m in metrics)
        return {**metrics[0], "system/learner_peak_memory_mb": peak}

    def checksum(self) -> str:
        checksums = gather([rank.checksum.remote() for rank in self.ranks], "checksum", self.timeout_s)
        if len(set(checksums)) > 1:
            raise RuntimeError(f"learner ranks hold different weights: checksums {checksums}")
        return checksums[0]

    def close(self) -> None:
        """End the ranks, and the placement group if the group made it."""
        for rank in self.ranks:
            ray.kill(rank)
        if self.owns_placement:
            remove_placement_group(self.placement)


def forwarding(method: str) -> Callable[..., Any]:
    """A LearnerGroup method that runs the Learner's `method` as the group's routes say (ROUTES, or
    SHARDED_ROUTES under fsdp; its name, signature and docstring are the Learner's)."""

    @functools.wraps(getattr(Learner, method))
    def forward(self: LearnerGroup, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, self.routes[method], *args, **kwargs)

    return forward


def unrouted(learner_cls: type, group_cls: type) -> list[str]:
    """The public methods of `learner_cls` that `group_cls` does not offer (GROUP_ONLY, ONE_RANK_ONLY aside)."""
    return sorted(name for name in dir(learner_cls)
                  if not name.startswith("_") and name not in GROUP_ONLY | ONE_RANK_ONLY
                  and callable(getattr(learner_cls, name)) and not hasattr(group_cls, name))


def offer_learner_methods(group_cls: type) -> None:
    """Give `group_cls` a forwarding method for each of ROUTES; TypeError if that leaves out a
    public Learner method (so that a new one cannot be forgotten) or overrides one of its own."""
    for method in ROUTES:
        if method in vars(group_cls):
            raise TypeError(f"{group_cls.__name__}.{method} is both defined and in ROUTES: drop one")
        setattr(group_cls, method, forwarding(method))
    if missing := unrouted(Learner, group_cls):
        raise TypeError(f"{group_cls.__name__} does not offer the Learner's {missing}: add them to ROUTES "
                        "(learner/group.py)")


offer_learner_methods(LearnerGroup)
