"""DAPO's dynamic sampling: every step trains on `prompts_per_step` informative groups.

A group whose rewards are all equal has zero advantages and carries no gradient
(grpo.informative_groups, as reward/chunk_stats.informative applies it). With
`algo.dynamic_sampling` a step's batch is collected in rounds:

    round 1       the batch as submitted: prompts_per_step prompts, positions 0 .. P-1
    round k > 1   while fewer than prompts_per_step informative groups are in and fewer than
                  algo.dynamic_sampling_max_rounds rounds ran: more prompts from the cursor,
                  seeded prompt_seed(seed, step, position), positions continuing after the
                  previous rounds' (pipeline.submit(..., after=...))

The filtering happens where the groups are: the reward actor that scores a chunk passes on
only its informative groups and counts them in its small stats (RewardWorker.score_chunk with
`informative_only`); the driver adds up counts, never sees a group.

Round size: round k asks for enough prompts to fill what is missing at the informative share
seen so far in this step, ceil(missing x generated / informative), at most prompts_per_step
(prompts_per_step when nothing was informative yet). Prompts cost generation time in
proportion on CPU engines; a full round for a few missing groups would mostly be surplus.

The step trains on the first prompts_per_step informative groups in generation order (rounds,
then chunks, then prompts): the learner takes `max_groups` of the references it is handed.
The surplus of the last round is dropped, as DAPO does: kept for the next step it would be
trained on by a newer policy than the one the rest of that batch is checked against, one
version stale where max_staleness is 0 (sync mode). Every count the choice depends on is
fixed by the seeds and versions, so a run stays reproducible.

With the bound reached the step trains on the informative groups it has (fewer than asked);
with none, it trains on nothing: the trainer skips the learner step, the policy version stays,
no weights are pushed (loop.py).

Asynchronously (max_staleness k >= 1) the rounds after the first are submitted when the
controller collects the step, behind the pushes already queued: each engine samples them with
the newest version it was sent, so they lag the learner that trains on them by 0 versions,
and the pipeline checks their staleness like any chunk's. They also queue behind the batches of
the next k steps already submitted, which the engines generate first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import ray

from grpo_dist.controller.batches import Batch, ScoredBatch, combine
from grpo_dist.controller.pipeline import RolloutPipeline
from grpo_dist.common.types import Prompt


def round_size(missing: int, informative_so_far: int, generated: int, most: int) -> int:
    """Prompts for the next round: ceil(missing / share), the share being the informative groups
    of those generated so far; `most` when none was informative, and never more."""
    if informative_so_far == 0:
        return most
    return min(most, math.ceil(missing * generated / informative_so_far))


@dataclass
class DynamicSampling:
    """Collects a step in rounds (see the module docstring); the controller calls `collect` where
    it would call RolloutPipeline.collect. `draw(n)` gives the cursor's next n prompts."""

    pipeline: RolloutPipeline
    draw: Callable[[int], list[Prompt]]
    target: int  # rollout.prompts_per_step
    max_rounds: int  # algo.dynamic_sampling_max_rounds

    def collect(self, batch: Batch, learner_version: int) -> ScoredBatch:
        """The step's informative groups, by reference; `max_groups` says how many to train on."""
        rounds = [(batch, self.pipeline.collect(batch, learner_version))]
        kept = int(count(rounds[0][1], "informative"))
        while kept < self.target and len(rounds) < self.max_rounds:
            generated = sum(part.num_prompts for part, _ in rounds)
            prompts = self.draw(round_size(self.target - kept, kept, generated, self.target))
            more = self.pipeline.submit(batch.step, prompts, batch.chunks[0].sampling, learner_version,
                                        after=rounds[-1][0])
            rounds.append((more, self.pipeline.collect(more, learner_version)))
            kept += int(count(rounds[-1][1], "informative"))
        whole = combine(rounds, learner_version)
        trained = min(kept, self.target)
        completions = count(whole, "completions")
        generated_groups = count(whole, "groups")
        metrics = {
            "rollout/dynamic_rounds": float(len(rounds)),
            "rollout/dynamic_groups": float(trained),
            "rollout/dynamic_dropped_fraction": 1.0 - kept / generated_groups,  # uninformative / generated
            "rollout/dynamic_surplus_groups": float(kept - trained),
            "rollout/dynamic_extra_completions": completions - count(rounds[0][1], "completions"),
            "rollout/dynamic_bound_reached": float(trained < self.target),
        }
        return replace(whole, group_refs=self.first_chunks(whole, trained), max_groups=trained,
                       metrics={**whole.metrics, **metrics})

    @staticmethod
    def first_chunks(scored: ScoredBatch, groups: int) -> list[ray.ObjectRef]:
        """The references of the chunks that hold the first `groups` informative groups (empty
        chunks left out)."""
        refs, held = [], 0
        for ref, stat in zip(scored.group_refs, scored.stats):
            if held >= groups:
                break
            if stat["informative"]:
                refs.append(ref)
                held += int(stat["informative"])
        return refs


def count(scored: ScoredBatch, key: str) -> float:
    """The sum of one of the chunks' stats (score_chunk's), e.g. informative groups."""
    return sum(stat[key] for stat in scored.stats)
