"""The controller: GRPO with rollouts running up to `max_staleness` policy versions ahead.

    prompts -> RolloutWorker x N -> RewardWorker x M -> Learner -> weights -> RolloutWorker x N

One loop serves both modes; sync mode is async mode with max_staleness 0. Step t:

    collect batch t (pipeline.py)          wait for its chunks' small stats; the groups stay put
    learner.train_step(*refs of batch t)   submitted (sync: or overlap.py's finish_step, chunks learned as scored)
    push weights version t                 queued on every actor behind what it is doing
    submit batch t + k + 1                 queued behind that push, so sampled by version t
    wait for step t's learner metrics      (the engines keep generating batch t + 1 .. t + k)

so batch t is sampled by version t - k - 1 (0 for the first k + 1 batches) and trained on by
version t - 1: never more than k versions old. The driver holds references and metrics; the
actors do the generation, scoring and training.

Checkpoints and failures (docs/checkpoints.md). After step t is complete (trained, its metrics
logged) the controller saves a checkpoint (checkpoints.py) every `trainer.checkpoint_every` steps,
after the last step, on an early stop, and when SIGINT or SIGTERM asks it to stop (signals.py);
the learner is idle then, so its share is that of step t. A resumed run restores the data cursor
and the batches drawn but not trained (when the TrainingRun is made, checkpointing.py), then the learner's state, and
pushes the checkpoint's weights to every engine, verified, before anything is generated. Rollout
and reward actors whose process dies are restarted by Ray and caught up by the Supervisor
(recovery.py); a learner that dies ends the run (LearnerLost). Every wait is bounded
(trainer.call_timeout_s, trainer.weight_sync_timeout_s).

With algo.dynamic_sampling, collecting batch t may add rounds of prompts until it holds
prompts_per_step informative groups (dynamic.py); they are sampled by the newest version pushed.
A step that finds none trains on nothing: the version stays and no weights are pushed, so from
then on versions run behind step numbers, and the staleness rule still holds.
"""

from __future__ import annotations

import signal
import time
from collections import deque

import ray

from grpo_dist.config.schema import Config, resolve_overlap
from grpo_dist.controller.actors import Actors, LearnerWatch
from grpo_dist.controller.checkpointing import BAD_STEPS, Checkpointer, Drawn, StartPoint, driver_state
from grpo_dist.controller.dynamic import DynamicSampling
from grpo_dist.controller.errors import NOT_FINITE, TooManyBadSteps
from grpo_dist.controller.evaluator import Evaluator
from grpo_dist.controller.overlap import LearnerFeed
from grpo_dist.controller.batches import Batch, ScoredBatch
from grpo_dist.controller.pipeline import RolloutPipeline
from grpo_dist.controller.publish import WeightPublisher
from grpo_dist.controller.recovery import RESTART_COUNTERS
from grpo_dist.controller.retry import Retry
from grpo_dist.controller.signals import StopRequest
from grpo_dist.observe.metrics import MetricsLog
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.observe.timeline import Timeline
from grpo_dist.common.types import Group, Prompt, SamplingSettings
from grpo_dist.common.waits import fetch


class StepLoop:
    """The steps of a run, from `start.first_step` to trainer.steps: fills the pipeline ahead,
    trains each batch, pushes its weights, evaluates and checkpoints on schedule, and stops early
    on a signal, a time limit or too many bad steps.

    What tests and tools may use besides `train`: `step(n)`, `fill`, `discard_in_flight`,
    `rollout(...)`, and `pipeline`, `cursor`, `sampling`, `in_flight`, `submitted`, `version`, `counters`.
    """

    def __init__(self, config: Config, start: StartPoint, actors: Actors, retry: Retry, counters: dict[str, float],
                 publisher: WeightPublisher, learner_watch: LearnerWatch, evaluator: Evaluator,
                 checkpointer: Checkpointer, timeline: Timeline, stop_request: StopRequest) -> None:
        """`counters`: the run totals, saved in checkpoints: the Supervisor's restarts, retries and
        hangs (recovery.py), which each step logs the increase of, and the bad steps in a row."""
        self.config, self.timeline, self.stop_request = config, timeline, stop_request
        self.publisher, self.learner_watch = publisher, learner_watch
        self.counters = counters
        self.evaluator, self.checkpointer = evaluator, checkpointer
        trainer, algo = config.trainer, config.algo
        self.max_staleness = trainer.max_staleness if trainer.mode == "async" else 0
        self.sampling = sampling_settings(config.rollout)
        self.first_step, self.cursor = start.first_step, start.cursor
        self.redraw: deque[Drawn] = start.redraw  # drawn, not trained (a resume's): go first
        self.pipeline = RolloutPipeline(actors.rollouts, actors.rewards, retry, publisher, seed=trainer.seed,
                                        chunk_prompts=config.rollout.chunk_prompts, timeout_s=trainer.call_timeout_s,
                                        informative_only=algo.dynamic_sampling)
        # collect(batch, version): the pipeline's, or dynamic sampling's rounds on top of it (dynamic.py)
        self.collector = (DynamicSampling(self.pipeline, self.cursor.next_batch, config.rollout.prompts_per_step,
                                          algo.dynamic_sampling_max_rounds) if algo.dynamic_sampling else self.pipeline)
        self.feed = LearnerFeed(actors.learner, overlap=resolve_overlap(config))  # whole, or chunk by chunk
        self.in_flight: deque[Batch] = deque()  # submitted batches not yet handed to the learner
        self.submitted = self.first_step - 1  # the last step whose batch was submitted
        self.latest: ScoredBatch | None = None  # the latest batch collected: its groups (samples log), its failure
        self.first_bad: str | None = None  # why the first of the bad steps in a row was bad
        self.step_clock: float | None = None  # when the current step began (the previous one ended)

    @property
    def version(self) -> int:
        """The learner's policy version: the latest one pushed to the engines."""
        return self.publisher.version

    def train(self, log: MetricsLog, started: float) -> int:
        """Steps first_step..trainer.steps, or until a stop; returns the last step done."""
        trainer = self.config.trainer
        step = self.first_step - 1
        while step < trainer.steps and self.stop_request.signum is None:
            step += 1
            metrics = self.step(step)
            log.log(step, metrics)
            if step == self.first_step:
                log.note(self.timeline.first_step(metrics["time/step_s"], metrics.get("time/learn_ended")))
            if step == trainer.steps:
                self.timeline.ending()
            if metrics.get("rollout/dynamic_groups") == 0:
                log.note(f"step {step}: no informative group in {metrics['rollout/dynamic_rounds']:.0f} rounds "
                         f"(algo.dynamic_sampling_max_rounds): no update, the policy stays version {self.version}")
            if log.wants_samples(step):
                log.log_samples(step, self.sample_groups(trainer.samples_per_log))
            if trainer.eval_every and step % trainer.eval_every == 0 and step < trainer.steps:
                self.evaluator.evaluate(step, log)
                self.step_clock = time.perf_counter()  # a step's time leaves the evaluation out
            why = self.latest.failure or (NOT_FINITE if metrics.get("policy/step_skipped") else None)
            self.counters[BAD_STEPS] = self.counters[BAD_STEPS] + 1 if why else 0
            self.first_bad = why if self.counters[BAD_STEPS] == 1 else self.first_bad or why
            out_of_time = bool(trainer.max_wall_seconds) and time.time() - started > trainer.max_wall_seconds
            bad = self.counters[BAD_STEPS] >= trainer.max_bad_steps
            every = trainer.checkpoint_every and step % trainer.checkpoint_every == 0
            if every or step == trainer.steps or out_of_time or bad or self.stop_request.signum is not None:
                with self.timeline.phase("checkpoint"):
                    self.checkpointer.save(driver_state(step, self.version, self.cursor, self.counters,
                                                        self.drawn_not_trained()))
            if bad:
                raise TooManyBadSteps.of(step, trainer.max_bad_steps, self.first_bad,
                                         self.checkpointer.saved[1] / "policy")
            if out_of_time:
                log.note(f"stopping after {step} steps: max_wall_seconds={trainer.max_wall_seconds} reached")
                break
        if self.stop_request.signum is not None:
            log.note(f"stopped by {signal.Signals(self.stop_request.signum).name} after step {step}")
        self.discard_in_flight()
        self.publisher.verify_through(self.version)
        return step

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step: hand batch `step` to the learner, push the new weights, submit the
        batch `max_staleness + 1` steps ahead; returns the step's metrics."""
        self.learner_watch.step = step
        self.step_clock = self.step_clock or time.perf_counter()
        counted = {name: self.counters[name] for name in RESTART_COUNTERS}
        self.publisher.catch_up()
        self.fill(step + self.max_staleness)  # (only the first step has anything to fill here)
        batch = self.in_flight.popleft()
        scored = self.collector.collect(batch, self.version)
        self.publisher.verify_through(max(scored.versions))  # the weights that sampled it had arrived
        depth = self.pipeline.buffer_depth([batch, *self.in_flight], self.config.rollout.prompts_per_step)
        self.latest = scored
        result = None  # dynamic sampling may find no informative group: no update, no new version, no push
        if scored.group_refs:
            result = self.feed.train(scored)
            self.publisher.publish(self.version + 1)
        self.fill(step + self.max_staleness + 1)
        learner_metrics = (self.learner_watch.call(result, "train_step") if result is not None
                           else {"policy/version": float(self.version), "time/learn_s": 0.0})
        now = time.perf_counter()
        step_s, self.step_clock = now - self.step_clock, now
        workers = len(self.pipeline.rollouts)
        return {
            **scored.metrics,
            **learner_metrics,
            **{name: self.counters[name] - counted[name] for name in RESTART_COUNTERS},
            "rollout/buffer_depth": depth,
            "weights/verified_version": float(self.publisher.verified),
            "data/epoch": float(batch.drawn_at["epoch"]),
            "data/position": float(batch.drawn_at["position"]),
            "time/step_s": step_s,
            "time/rollout_idle_fraction": max(0.0, 1.0 - scored.generate_busy_s / (workers * step_s)),
            "time/learner_idle_fraction": max(0.0, 1.0 - learner_metrics["time/learn_s"] / step_s),
        }

    def fill(self, last_step: int) -> None:
        """Submit the batches of steps up to `last_step` (and `trainer.steps`) not yet submitted,
        to be sampled by the current version; the batches a resume restored go first."""
        while self.submitted < min(last_step, self.config.trainer.steps):
            self.submitted += 1
            if self.redraw:
                drawn_at, prompts = self.redraw.popleft()
            else:
                drawn_at, prompts = self.cursor.state(), self.cursor.next_batch(self.config.rollout.prompts_per_step)
            batch = self.pipeline.submit(self.submitted, prompts, self.sampling, self.version)
            batch.drawn_at = drawn_at
            self.in_flight.append(batch)
            self.feed.submitted(batch)

    def discard_in_flight(self) -> None:
        """Cancel batches submitted for steps that will not run (an early stop)."""
        for chunk in [chunk for batch in self.in_flight for chunk in batch.chunks]:
            ray.cancel(chunk.info)
        self.in_flight.clear()

    def drawn_not_trained(self) -> list[Drawn]:
        """The batches drawn from the cursor and not trained yet, in step order."""
        return [(batch.drawn_at, batch.prompts) for batch in self.in_flight] + list(self.redraw)

    def sample_groups(self, count: int) -> list[Group]:
        """The first `count` groups of the latest batch, fetched into the driver (the samples log)."""
        groups: list[Group] = []
        for ref in self.latest.group_refs:
            if len(groups) >= count:
                break
            groups += fetch([ref], ["reward actor: scored groups"], self.config.trainer.call_timeout_s)[0]
        return groups

    def rollout(self, prompts: list[Prompt], sampling: SamplingSettings, step: int) -> list[Group]:
        """Generate and score `prompts` now and fetch the groups into the driver (tests, tools)."""
        scored = self.pipeline.collect(self.pipeline.submit(step, prompts, sampling, self.version), self.version)
        names = ["reward actors: scored groups"] * len(scored.group_refs)
        return [group for chunk in fetch(scored.group_refs, names, self.config.trainer.call_timeout_s)
                for group in chunk]
