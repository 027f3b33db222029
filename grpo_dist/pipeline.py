"""Rollout scheduling: a step's prompts travel in chunks, generate -> score -> learner, by reference.

    submit(step, prompts): one chunk = the prompts of one engine call
        RolloutWorker.generate_chunk --groups--> RewardWorker.score_chunk --scored groups--> Learner.train_step(*refs)
                 `-- info: version, timing             `-- stats: sums, failures, timing
    collect(batch, learner_version): waits for every chunk's info and stats, nothing more

The driver holds object references and a few floats per chunk, never a group: Ray hands a
chunk's groups from the rollout actor to the reward actor as soon as they exist, and the
scored groups on to the learner, which resolves the references itself. Ray would return a
value under 100 KiB to the caller's own memory and forward it from there, so the rollout
and reward actors run with BY_REFERENCE: their results, however small, go to the object
store of their node (docs/async.md has the driver's memory, measured).

Versions. A Ray actor runs the calls one driver submits in the order it submitted them. The
controller submits the push of weights version v before the chunks that v should sample, so
each engine takes new weights between two of its calls, and every chunk, one engine call,
is sampled by one version: the chunk's `version`, recorded when it is submitted. The
staleness of a batch is thus decided when it is submitted, within `max_staleness`.

Failures (restarts.py). `collect` checks every chunk against what its engine reports. A
chunk sampled by a version other than its own (a worker that died and was restarted, with
the initial weights, between two calls) is dropped (`rollout/dropped_stale` counts its
groups); a chunk whose generate call failed (its worker died) is lost. Either way the
controller gives that worker the current weights (`revive`), and the chunk is generated
again there, same prompts and seeds, sampled by the current version (`rollout/retries`). A
chunk whose scoring failed (its reward actor died) is scored again (`reward/retries`). A
chunk is the unit that can be sent again to any worker (`launch`); one sent again more than
`max_retries` times stops the run.

Every wait is bounded by `trainer.call_timeout_s`; running past it raises CallTimeout, which
names the actor and the stage that did not finish.

Dynamic sampling (dynamic.py) collects a step in rounds: with `informative_only` the reward
actors pass on only the groups that carry a gradient and count them; `submit(..., after=)`
continues a step's prompt positions, and `combine` makes one batch of the rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import ray

from grpo_dist.chunk_stats import batch_metrics
from grpo_dist.restarts import ActorLost
from grpo_dist.seeding import prompt_seed
from grpo_dist.types import Prompt, SamplingSettings

T = TypeVar("T")


# Runtime environment of the rollout and reward actors: every return value is put in the
# object store (the threshold under which Ray inlines it into the caller is 0 bytes).
BY_REFERENCE = {"env_vars": {"RAY_max_direct_call_object_size": "0"}}


class CallTimeout(TimeoutError):
    """An actor call ran past `trainer.call_timeout_s`; the message names the actor and the stage."""


class ChunkFailed(RuntimeError):
    """A chunk was lost, or sampled by the wrong weights, more often than `max_retries`."""


def split(items: list[T], parts: int) -> list[list[T]]:
    """Contiguous, nearly equal chunks (some may be empty when items < parts)."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        chunks.append(items[start:end])
        start = end
    return chunks


def wait_all(refs: list[ray.ObjectRef], names: list[str], timeout_s: float) -> None:
    """Wait at most `timeout_s` until every ref is done (or failed); `names[i]` says which
    actor computes `refs[i]` at which stage, for the CallTimeout message."""
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=False)
    if pending:
        late = set(pending)
        where = "; ".join(dict.fromkeys(name for ref, name in zip(refs, names) if ref in late))
        raise CallTimeout(f"{where}: not done after {timeout_s:g} s (trainer.call_timeout_s)")


def fetch(refs: list[ray.ObjectRef], names: list[str], timeout_s: float) -> list[Any]:
    """The values of `refs`, waiting at most `timeout_s` for all of them (see `wait_all`)."""
    wait_all(refs, names, timeout_s)
    return ray.get(refs)


def first_line(error: BaseException) -> str:
    """The first line of an error's message (Ray's run to dozens of lines)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def fetch_each(refs: list[ray.ObjectRef], names: list[str], timeout_s: float) -> list[Any]:
    """`fetch`, except that a call whose actor died gives its ActorLost error in its place."""
    wait_all(refs, names, timeout_s)
    values = []
    for ref in refs:
        try:
            values.append(ray.get(ref))
        except ActorLost as lost:
            values.append(lost)
    return values


@dataclass
class Chunk:
    """Prompts generated by one engine call and scored by one reward call; the references
    of its latest attempt."""

    step: int
    index: int
    prompts: list[Prompt]
    seeds: list[int]
    sampling: SamplingSettings
    reward: int
    version: int  # the policy version it must be sampled by: the last one pushed before it
    worker: int = -1
    generated: ray.ObjectRef | None = None  # generate_chunk's groups, unscored
    info: ray.ObjectRef | None = None  # generate_chunk's: policy version, timing
    groups: ray.ObjectRef | None = None  # the scored groups
    stats: ray.ObjectRef | None = None  # score_chunk's: sums, failures, timing
    retries: int = 0

    def stage_names(self) -> list[str]:
        where = f"chunk {self.index} of step {self.step}"
        return [f"rollout worker {self.worker}: generate_chunk ({where})",
                f"reward actor {self.reward}: score_chunk ({where})"]


@dataclass
class Batch:
    """The chunks of one step, in the order of their prompts; their positions in the step
    start at `first_position` (a later round of dynamic sampling continues an earlier one's)."""

    step: int
    chunks: list[Chunk]
    drawn_at: dict[str, int] | None = None  # the data cursor before its prompts were drawn (the trainer's)
    first_position: int = 0

    @property
    def groups(self) -> int:
        return sum(len(chunk.prompts) for chunk in self.chunks)

    @property
    def prompts(self) -> list[Prompt]:
        return [prompt for chunk in self.chunks for prompt in chunk.prompts]

    @property
    def end(self) -> int:
        """The position after this batch's last prompt."""
        return self.first_position + self.groups


@dataclass
class Collected:
    """A batch ready for the learner: the references to pass on, and what the driver learned."""

    groups: list[ray.ObjectRef]  # one per chunk: Learner.train_step(*groups)
    stats: list[dict[str, float]]  # one per chunk (score_chunk)
    versions: list[int]  # the policy version that sampled each chunk
    metrics: dict[str, float]
    generate_busy_s: float  # engine seconds spent generating the batch, all workers together
    infos: list[dict[str, float]]  # one per chunk (generate_chunk)
    max_groups: int | None = None  # train on the first max_groups groups of `groups` (None: all)


class RolloutPipeline:
    """Submits chunks to the rollout and reward actors and collects what the driver needs.

    `revive(role, index)` is the controller's answer to a lost or wrongly sampled chunk: it
    makes rollout worker `index` serve the current weights (its push queued before anything
    sent after it) and returns that version, or checks that reward actor `index` is coming
    back. `counters` gets `rollout/retries` and `reward/retries` added up.
    """

    def __init__(self, rollouts: list[Any], rewards: list[Any], *, seed: int, chunk_prompts: int,
                 max_staleness: int, timeout_s: float, revive: Callable[[str, int], int], max_retries: int,
                 counters: dict[str, float], informative_only: bool = False) -> None:
        """`informative_only` (dynamic sampling): the reward actors pass on only the groups
        whose rewards are not all equal, and count them in their stats (dynamic.py)."""
        self.rollouts, self.rewards = rollouts, rewards
        self.seed, self.chunk_prompts = seed, chunk_prompts
        self.max_staleness, self.timeout_s = max_staleness, timeout_s
        self.revive, self.max_retries, self.counters = revive, max_retries, counters
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
                for worker, share in enumerate(split(list(range(len(prompts))), len(self.rollouts)))
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
        chunk.groups, chunk.stats = self.rewards[chunk.reward].score_chunk.options(num_returns=2).remote(
            chunk.generated, self.informative_only)

    def wait(self, chunks: list[Chunk]) -> tuple[list[dict[str, float]], list[dict[str, float]], int]:
        """Every chunk's generation info, then its scoring stats (small), in chunk order, and
        the groups dropped for being sampled by the wrong weights. A timeout names the first
        stage that did not finish."""
        infos, dropped = self.generated(chunks)
        return infos, self.scored(chunks), dropped

    def generated(self, chunks: list[Chunk]) -> tuple[list[dict[str, float]], int]:
        """Each chunk's generation info, once it is sampled by its version: lost and wrongly
        sampled chunks are generated again by their worker, revived first."""
        infos: list[Any] = [None] * len(chunks)
        dropped, pending = 0, list(range(len(chunks)))
        while pending:
            names = [chunks[i].stage_names()[0] for i in pending]
            again = []
            for i, info in zip(pending, fetch_each([chunks[i].info for i in pending], names, self.timeout_s)):
                infos[i] = info
                if isinstance(info, ActorLost):
                    again.append((i, first_line(info)))
                elif info["policy_version"] != chunks[i].version:
                    dropped += len(chunks[i].prompts)
                    again.append((i, f"sampled by policy version {info['policy_version']:.0f}, not {chunks[i].version}"))
            current = {worker: self.revive("rollout", worker) for worker in sorted({chunks[i].worker for i, _ in again})}
            for i, why in again:
                self.count_retry(chunks[i], "rollout", why)
                chunks[i].version = current[chunks[i].worker]
                self.launch(chunks[i], chunks[i].worker)
            pending = [i for i, _ in again]
        return infos, dropped

    def scored(self, chunks: list[Chunk]) -> list[dict[str, float]]:
        """Each chunk's scoring stats; a chunk whose reward actor died is scored again there."""
        stats: list[Any] = [None] * len(chunks)
        pending = list(range(len(chunks)))
        while pending:
            names = [chunks[i].stage_names()[1] for i in pending]
            for i, stat in zip(pending, fetch_each([chunks[i].stats for i in pending], names, self.timeout_s)):
                stats[i] = stat
            pending = [i for i in pending if isinstance(stats[i], ActorLost)]
            for reward in sorted({chunks[i].reward for i in pending}):
                self.revive("reward", reward)
            for i in pending:
                self.count_retry(chunks[i], "reward", first_line(stats[i]))
                self.score(chunks[i])
        return stats

    def count_retry(self, chunk: Chunk, role: str, why: str) -> None:
        """Count one more attempt of `chunk` in `<role>/retries`; ChunkFailed past max_retries."""
        chunk.retries += 1
        if chunk.retries > self.max_retries:
            stage = chunk.stage_names()[role == "reward"]
            raise ChunkFailed(f"{stage}: gave up after {self.max_retries} retries: {why}")
        self.counters[f"{role}/retries"] = self.counters.get(f"{role}/retries", 0.0) + 1

    def collect(self, batch: Batch, learner_version: int) -> Collected:
        """Wait until the batch is scored, sending lost and wrongly sampled chunks again."""
        infos, stats, dropped = self.wait(batch.chunks)
        return self.collected(batch, infos, stats, learner_version, dropped)

    def combine(self, rounds: list[tuple[Batch, Collected]], learner_version: int) -> Collected:
        """The rounds of one step (dynamic sampling), each collected, as one: their references in
        order, the metrics of all their chunks together."""
        batch = Batch(rounds[0][0].step, [chunk for part, _ in rounds for chunk in part.chunks])
        infos = [info for _, collected in rounds for info in collected.infos]
        stats = [stat for _, collected in rounds for stat in collected.stats]
        dropped = sum(collected.metrics["rollout/dropped_stale"] for _, collected in rounds)
        return self.collected(batch, infos, stats, learner_version, dropped)

    def collected(self, batch: Batch, infos: list[dict[str, float]], stats: list[dict[str, float]],
                  learner_version: int, dropped: float) -> Collected:
        """What the driver hands on and logs of a scored batch; `dropped`: groups generated again."""
        versions = [int(info["policy_version"]) for info in infos]
        metrics = {
            **batch_metrics(stats),
            **self.staleness(batch, versions, learner_version),
            "rollout/dropped_stale": float(dropped),
            **self.timings(batch, infos, stats),
        }
        busy = sum(info["generate_s"] for info in infos)
        return Collected([chunk.groups for chunk in batch.chunks], stats, versions, metrics, busy, infos)

    @staticmethod
    def staleness(batch: Batch, versions: list[int], learner_version: int) -> dict[str, float]:
        """How many versions each group lags the learner that trains on it, mean (over groups) and max."""
        lags = [(learner_version - version, len(chunk.prompts)) for chunk, version in zip(batch.chunks, versions)]
        return {"rollout/staleness_mean": sum(lag * n for lag, n in lags) / batch.groups,
                "rollout/staleness_max": float(max(lag for lag, _ in lags))}

    def timings(self, batch: Batch, infos: list[dict[str, float]], stats: list[dict[str, float]]) -> dict[str, float]:
        """Per stage, the busiest actor's seconds on this batch (queueing excluded); when generating it
        began and ended (unix seconds)."""

        def busiest(key: str, values: list[dict[str, float]], actor: str) -> float:
            per_actor: dict[int, float] = {}
            for chunk, value in zip(batch.chunks, values):
                owner = getattr(chunk, actor)
                per_actor[owner] = per_actor.get(owner, 0.0) + value[key]
            return max(per_actor.values())

        generate_s = busiest("generate_s", infos, "worker")
        tokens = sum(stat["tokens"] for stat in stats)
        return {"time/generate_s": generate_s, "time/reward_s": busiest("score_s", stats, "reward"),
                "time/sync_s": busiest("load_s", infos, "worker"),
                "time/generate_started": min(info["generate_started"] for info in infos),
                "time/generate_ended": max(info["generate_ended"] for info in infos),
                "system/generate_tokens_per_s": tokens / max(generate_s, 1e-9),
                "system/engine_peak_memory_mb": max(info["peak_memory_mb"] for info in infos)}

    def buffer_depth(self, batches: Iterable[Batch], prompts_per_step: int) -> float:
        """Scored groups waiting for the learner, in batches: the chunks of `batches` that are done."""
        chunks = [chunk for batch in batches for chunk in batch.chunks]
        if not chunks:
            return 0.0
        ready, _ = ray.wait([c.stats for c in chunks], num_returns=len(chunks), timeout=0, fetch_local=False)
        done = set(ready)
        return sum(len(chunk.prompts) for chunk in chunks if chunk.stats in done) / prompts_per_step
