"""Rollout scheduling: a step's prompts travel in chunks, generate -> score -> learner, by reference.

    submit(step, prompts): one chunk = the prompts of one engine call
        RolloutWorker.generate_chunk --groups--> RewardWorker.score_chunk --scored groups--> Learner.train_step(*refs)
                 `-- info: version, timing             `-- stats: sums, failures, timing
    collect(batch, learner_version): waits for every chunk's info and stats, nothing more

The chunks, batches and the metrics of a scored batch are batches.py's; this module moves them.

The driver holds object references and a few floats per chunk, never a group: Ray hands a
chunk's groups from the rollout actor to the reward actor as soon as they exist, and the
scored groups on to the learner, which resolves the references itself. Ray would return a
value under 100 KiB to the caller's own memory and forward it from there, so the local
cluster launch starts has that threshold at 0 (cluster.LOCAL_SYSTEM_CONFIG), and on a joined
cluster the rollout and reward actors run with it (actors.BY_REFERENCE): their results, however
small, go to the object store of their node (docs/async.md has the driver's memory, measured).

Versions. A Ray actor runs the calls one driver submits in the order it submitted them. The
controller submits the push of weights version v before the chunks that v should sample, so
each engine takes new weights between two of its calls, and every chunk, one engine call,
is sampled by one version: the chunk's `version`, recorded when it is submitted. The
staleness of a batch is thus decided when it is submitted, within `max_staleness`.

Failures (retry.py, recovery.py). `collect` waits through `Retry` and checks every chunk
against what its engine reports. A chunk sampled by a version other than its own (a worker
that died and was restarted, with the initial weights, between two calls) is dropped
(`rollout/dropped_stale` counts its groups); a chunk whose generate call failed (its worker
died) is lost. Either way Retry gets that worker back, the publisher gives it the current
weights (`WeightPublisher.repair`), and the chunk is generated again there, same prompts and
seeds, sampled by the current version (`rollout/retries`). A chunk whose scoring failed (its
reward actor died) is scored again (`reward/retries`). A chunk is the unit that can be sent
again to any worker (`launch`); one sent again more than cluster.max_restarts + 1 times stops
the run (ChunkFailed).

Every wait is bounded by `trainer.call_timeout_s` (waits.py). A chunk whose generation runs
past it hangs: its worker is killed (Ray restarts it, `rollout/hangs`) and the chunk is
generated again as after a death. A late scoring may wait on a hung engine: whichever actors
do not answer are killed (Retry's `probe`), then it is waited for again.

Dynamic sampling (dynamic.py) collects a step in rounds: with `informative_only` the reward
actors pass on only the groups that carry a gradient and count them; `submit(..., after=)`
continues a step's prompt positions, and `batches.combine` makes one batch of the rounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ray

from grpo_dist.controller.batches import Batch, Chunk, ScoredBatch, contiguous_shares, scored_batch
from grpo_dist.controller.publish import WeightPublisher
from grpo_dist.controller.retry import Call, Retry
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import Prompt, SamplingSettings
from grpo_dist.common.waits import ObjectLost


class RolloutPipeline:
    """Submits chunks to the rollout and reward actors and collects what the driver needs.

    A lost, hung or wrongly sampled chunk: `retry` (retry.py) gets its actor back and returns the
    rollout workers that need weights; the `publisher` repairs them (the push queued before
    anything sent after it) and says which version that is; the chunk is sent again, counted.
    """

    def __init__(self, rollouts: list[Any], rewards: list[Any], retry: Retry, publisher: WeightPublisher, *,
                 seed: int, chunk_prompts: int, timeout_s: float, informative_only: bool = False) -> None:
        """`informative_only` (dynamic sampling): the reward actors pass on only the groups
        whose rewards are not all equal, and count them in their stats (dynamic.py)."""
        self.rollouts, self.rewards, self.retry, self.publisher = rollouts, rewards, retry, publisher
        self.seed, self.chunk_prompts, self.timeout_s = seed, chunk_prompts, timeout_s
        self.informative_only = informative_only

    def submit(self, step: int, prompts: list[Prompt], sampling: SamplingSettings, version: int,
               after: Batch | None = None) -> Batch:
        """Split the prompts over the workers (contiguous shares), each share into chunks of
        `chunk_prompts`, and launch them all, to be sampled by policy `version` (the last one
        pushed); prompt i samples with prompt_seed(seed, step, i). `after`, an earlier round of
        the same step (dynamic sampling): the positions and the chunk numbers continue after its."""
        size = self.chunk_prompts
        first, first_chunk = (after.end, after.chunks[-1].index + 1) if after else (0, 0)
        seeds = [prompt_seed(self.seed, step, first + position) for position in range(len(prompts))]
        plan = [(round_, worker, share[start : start + size])
                for worker, share in enumerate(contiguous_shares(list(range(len(prompts))), len(self.rollouts)))
                for round_, start in enumerate(range(0, len(share), size))]
        chunks = [Chunk(step, first_chunk + index, [prompts[p] for p in positions], [seeds[p] for p in positions],
                        sampling, reward=0, version=version)
                  for index, (_, _, positions) in enumerate(plan)]
        # Launch round by round over the workers, so that a reward actor's queue, which it
        # works through in order, follows the order in which chunks finish generating.
        order = sorted(range(len(plan)), key=lambda index: plan[index][:2])
        for launched, index in enumerate(order):
            chunks[index].reward = launched % len(self.rewards)
            self.launch(chunks[index], worker=plan[index][1])
        return Batch(step, chunks, first_position=first)

    def launch(self, chunk: Chunk, worker: int) -> None:
        """Send the chunk to rollout worker `worker`, and its groups on to its reward actor."""
        chunk.worker = worker
        chunk.generated, chunk.info = self.rollouts[worker].generate_chunk.options(num_returns=2).remote(
            chunk.prompts, chunk.sampling, chunk.seeds)
        self.score(chunk)

    def score(self, chunk: Chunk) -> None:
        chunk.scored, chunk.stats = self.rewards[chunk.reward].score_chunk.options(num_returns=2).remote(
            chunk.generated, self.informative_only)

    def wait(self, chunks: list[Chunk]) -> tuple[list[dict[str, float]], list[dict[str, float]], int]:
        """Every chunk's generation info, then its scoring stats (small), in chunk order, and
        the groups dropped for being sampled by the wrong weights. A timeout names the first
        stage that did not finish."""
        infos, dropped = self.generation_infos(chunks)
        return infos, self.scoring_stats(chunks), dropped

    def generation_infos(self, chunks: list[Chunk]) -> tuple[list[dict[str, float]], int]:
        """Each chunk's generation info, once it is sampled by its version: lost, hung and wrongly
        sampled chunks are generated again by their worker, got back first (Retry, a hung one killed)."""
        infos: list[Any] = [None] * len(chunks)
        dropped, pending = 0, list(range(len(chunks)))
        while pending:
            waited = self.retry.wait([Call(chunks[i].info, chunks[i].stage_names()[0], ("rollout", chunks[i].worker))
                                      for i in pending], self.timeout_s)
            again, stale = [], []
            for position, i in enumerate(pending):
                infos[i] = info = waited.values[position]
                if position in waited.again:
                    again.append((i, waited.again[position]))
                elif info["policy_version"] != chunks[i].version:
                    dropped += len(chunks[i].prompts)
                    stale.append(("rollout", chunks[i].worker))
                    again.append((i, f"sampled by policy version {info['policy_version']:.0f}, not {chunks[i].version}"))
            version = self.publisher.repair(sorted({*waited.needs_weights, *self.retry.get_back(stale)}))
            for i, why in again:
                self.count_retry(chunks[i], "rollout", why)
                chunks[i].version = version
                self.launch(chunks[i], chunks[i].worker)
            pending = [i for i, _ in again]
        return infos, dropped

    def scoring_stats(self, chunks: list[Chunk]) -> list[dict[str, float]]:
        """Each chunk's scoring stats; a chunk whose reward actor died is scored again there, one
        whose groups were lost with their node is generated again (same prompts and seeds). A late
        one: the actors that hung (an engine whose output a reward call waits for, or the reward
        actor) are killed and revived (Retry's `probe`), then it is waited for again; CallTimeout
        when every actor answers (the call is slow, not hung)."""
        stats: list[Any] = [None] * len(chunks)
        pending = list(range(len(chunks)))
        while pending:
            waited = self.retry.wait([Call(chunks[i].stats, chunks[i].stage_names()[1], ("reward", chunks[i].reward),
                                           source=("rollout", chunks[i].worker)) for i in pending],
                                     self.timeout_s, late="probe")
            version = self.publisher.repair(waited.needs_weights)
            for position, i in enumerate(pending):
                stats[i] = waited.values[position]
            for position, why in waited.again.items():
                i = pending[position]
                if isinstance(stats[i], ObjectLost):  # its groups died with their node: generated again
                    self.count_retry(chunks[i], "rollout", why)
                    chunks[i].version = version
                    self.launch(chunks[i], chunks[i].worker)
                else:  # its reward actor died: scored again
                    self.count_retry(chunks[i], "reward", why)
                    self.score(chunks[i])
            pending = [pending[position] for position in [*waited.late, *waited.again]]
        return stats

    def count_retry(self, chunk: Chunk, role: str, why: str) -> None:
        """One more attempt of `chunk` (ChunkFailed past the bound: Retry.count_retry)."""
        chunk.retries += 1
        self.retry.count_retry(role, chunk.retries, chunk.stage_names()[role == "reward"], why)

    def collect(self, batch: Batch, learner_version: int) -> ScoredBatch:
        """Wait until the batch is scored, sending lost and wrongly sampled chunks again."""
        infos, stats, dropped = self.wait(batch.chunks)
        return scored_batch(batch, infos, stats, learner_version, dropped)

    def buffer_depth(self, batches: Iterable[Batch], prompts_per_step: int) -> float:
        """Scored groups waiting for the learner, in batches: the chunks of `batches` that are done."""
        chunks = [chunk for batch in batches for chunk in batch.chunks]
        if not chunks:
            return 0.0
        ready, _ = ray.wait([c.stats for c in chunks], num_returns=len(chunks), timeout=0, fetch_local=False)
        done = set(ready)
        return sum(len(chunk.prompts) for chunk in chunks if chunk.stats in done) / prompts_per_step
