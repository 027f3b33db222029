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
and the batches drawn but not trained (when the Trainer is made), then the learner's state, and
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

import itertools
import math
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import ray

from grpo_dist.atomic import write_json_atomic
from grpo_dist.config import Config, dump_config, resolve_overlap
from grpo_dist.controller.actors import Actors, LearnerWatch
from grpo_dist.controller.checkpoints import (Checkpoint, CheckpointError, TrainerState, check_shared_storage,
                                              save_checkpoint)
from grpo_dist.controller.dynamic import DynamicSampling
from grpo_dist.controller.errors import NOT_FINITE, RunFailed, TooManyBadSteps
from grpo_dist.controller.overlap import LearnerFeed
from grpo_dist.controller.pipeline import Batch, RolloutPipeline
from grpo_dist.controller.publish import WeightPublisher
from grpo_dist.controller.recovery import RESTART_COUNTERS, Supervisor
from grpo_dist.controller.signals import stop_on_signals
from grpo_dist.data import PreparedData, PromptCursor, prepare_data
from grpo_dist.evaluation import evaluate, standard_error
from grpo_dist.metrics import MetricsLog
from grpo_dist.plots import report_thread, write_report_beside
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.timeline import Timeline
from grpo_dist.types import Group, Prompt, SamplingSettings
from grpo_dist.waits import ActorLost, CallTimeout, ObjectLost, fetch, first_line
from grpo_dist.weights import WeightSync, make_weight_sync

BAD_STEPS = "bad_steps_in_a_row"  # kept with the restart counters in checkpoints


class Trainer:
    """Runs GRPO for `config.trainer.steps` steps and writes the run directory.

    What tests and tools may use besides `run`: `start`/`stop`, `step(n)`, `rollout(...)`,
    `verify_weights()`, and after `start` the parts it wires together: `actors` (the handles),
    `pipeline`, `supervisor`, `weights` (the WeightPublisher), with `version`, `counters`,
    `cursor` and `sampling`. Everything else is the loop's own.
    """

    def __init__(self, config: Config, run_dir: Path, data: PreparedData | None = None,
                 resume: Checkpoint | None = None, timeline: Timeline | None = None,
                 actors: Actors | None = None) -> None:
        """`data`: the prompts launch prepared while Ray started; prepared here when not given.
        `actors`: created by launch while the data were read (`Actors.create`); else by `start`.
        `resume`: the checkpoint to continue from; its data cursor is restored here (CheckpointError
        when this run's data differ). `timeline`: the run's start and end (launch's, from the command)."""
        self.config, self.run_dir = config, run_dir
        self.timeline = timeline or Timeline()
        data = data if data is not None else prepare_data(config)
        self.train_prompts, self.eval_prompts = data.train, data.eval
        self.cursor = PromptCursor(self.train_prompts, config.trainer.seed)
        self.sampling = sampling_settings(config.rollout)
        trainer = config.trainer
        self.max_staleness = trainer.max_staleness if trainer.mode == "async" else 0
        self.resume = resume
        self.redraw: deque[tuple[dict[str, int], list[Prompt]]] = deque()  # drawn, not trained: go first
        self.start_version = 0  # the policy version the learner starts from
        self.start_counters: dict[str, float] = {BAD_STEPS: 0.0}
        if resume is not None:
            self.cursor, batches = resume.restore_data(self.train_prompts, trainer.seed)
            self.redraw.extend(batches)
            self.start_version = resume.state.policy_version
            self.start_counters.update(resume.state.counters)
        self.first_step = 1 if resume is None else resume.state.step + 1
        self.actors = actors
        self.transport: WeightSync | None = None
        self.learner_watch: LearnerWatch | None = None
        self.weights: WeightPublisher | None = None
        self.supervisor: Supervisor | None = None
        self.pipeline: RolloutPipeline | None = None
        self.feed: LearnerFeed | None = None  # batches to the learner: whole, or chunk by chunk (overlap.py)
        # collect(batch, version): the pipeline's, or dynamic sampling's rounds on top of it (dynamic.py)
        self.collector: RolloutPipeline | DynamicSampling | None = None
        self.in_flight: deque[Batch] = deque()  # submitted batches not yet handed to the learner
        self.submitted = self.first_step - 1  # the last step whose batch was submitted
        self.last_group_refs: list[ray.ObjectRef] = []  # the latest batch's scored groups (for sample logs)
        self.failure: str | None = None  # what failed on every sample of the latest batch (ScoredBatch.failure)
        self.first_bad: str | None = None  # why the first of the bad steps in a row was bad
        self.step_clock: float | None = None  # when the current step began (the previous one ended)
        self.stop_signal: int | None = None  # the first SIGINT/SIGTERM received
        self.saved: tuple[int, Path] | None = None  # the step and path of the latest checkpoint
        self.report: Future | None = None  # report.png, drawn in a thread while the actors and Ray stop

    @property
    def version(self) -> int:
        """The learner's policy version: the latest one pushed to the engines."""
        return self.start_version if self.weights is None else self.weights.version

    @property
    def counters(self) -> dict[str, float]:
        """Run totals: restarts, retries (recovery.py) and bad steps in a row; kept in checkpoints."""
        return self.start_counters if self.supervisor is None else self.supervisor.counters

    def start(self, weight_sync: Callable[[Config, Any, list[Any]], WeightSync] = make_weight_sync) -> None:
        """Start the actors, the weight transport (`trainer.weight_sync`, built by `weight_sync`),
        the supervisor and the pipeline."""
        config, trainer = self.config, self.config.trainer
        with self.timeline.phase("actors"):
            self.actors = (self.actors or Actors.create(config)).wait_ready(config.cluster.actor_start_timeout_s)
        self.timeline.details["actor_ready_s"] = self.actors.ready_s
        try:
            with self.timeline.phase("weight_sync_setup"):
                self.transport = weight_sync(config, self.actors.learner, self.actors.rollouts)
                self.transport.setup()
        except BaseException:
            self.stop()
            raise
        watch = self.learner_watch = LearnerWatch(self.actors.learner, trainer.call_timeout_s)
        self.weights = WeightPublisher(self.transport, watch, self.actors.rollouts, verify=trainer.verify_weight_sync,
                                       timeout_s=trainer.call_timeout_s, version=self.start_version)
        self.supervisor = Supervisor({"rollout": self.actors.rollouts, "reward": self.actors.rewards}, watch,
                                     self.weights, max_restarts=config.cluster.max_restarts,
                                     start_timeout_s=config.cluster.actor_start_timeout_s,
                                     counters=self.start_counters)
        algo = config.algo
        self.pipeline = RolloutPipeline(self.actors.rollouts, self.actors.rewards, self.supervisor, seed=trainer.seed,
                                        chunk_prompts=config.rollout.chunk_prompts, timeout_s=trainer.call_timeout_s,
                                        informative_only=algo.dynamic_sampling)
        self.collector = (DynamicSampling(self.pipeline, self.cursor.next_batch, config.rollout.prompts_per_step,
                                          algo.dynamic_sampling_max_rounds) if algo.dynamic_sampling else self.pipeline)
        self.feed = LearnerFeed(self.actors.learner, overlap=resolve_overlap(config))

    def stop(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.actors is not None:
            self.actors.stop()

    def run(self, wait_report: bool = True) -> dict[str, Any]:
        """Train, evaluate and save; the summary says `stopped_by` when a signal stopped the run.
        With `wait_report` False report.png may still be drawn when this returns: `finish_summary`
        waits for it (launch: while Ray shuts down)."""
        started = time.time()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(self.config))
        records = self.resume.restore_metrics(self.run_dir) if self.resume is not None else []
        started -= records[-1]["wall_s"] if records else 0.0  # wall_s goes on from where the run was
        before = next((r["eval/accuracy"] for r in records if r["kind"] == "eval" and r["step"] == 0), math.nan)
        timeline = self.timeline
        with timeline.phase("loggers"):
            log = MetricsLog(self.run_dir, self.config, started, None if self.resume is None else self.first_step - 1)
        with stop_on_signals(self.request_stop):
            self.start()
            try:
                with timeline.phase("describe_and_storage_check"):
                    engines = sorted({d["engine"] for d in self.call(
                        [w.describe.remote() for w in self.actors.rollouts], "rollout workers: describe")})
                    self.check_shared_storage()
                if self.resume is None:
                    with timeline.phase("first_weight_check"):
                        self.verify_weights()
                    with timeline.phase("eval_before"):
                        before = self.evaluate(step=0, log=log)
                else:
                    with timeline.phase("restore"):
                        self.restore_learner()
                steps = self.train(log, started)
                timeline.ending()  # (already, after the last step; an early stop ends here)
                after = math.nan
                drawing = report_thread()  # matplotlib is imported while the final evaluation runs
                if self.stop_signal is None:
                    with timeline.phase("eval_after"):
                        after = self.evaluate(step=steps, log=log)
                    timeline.mark("final_eval_done")
                self.report = write_report_beside(self.run_dir, drawing)  # metrics.jsonl is complete
                if self.stop_signal is None and self.config.trainer.save_final:
                    with timeline.phase("save_final"):
                        self.learner_watch.call(self.actors.learner.save.remote(str(self.run_dir / "final")), "save")
            finally:
                with timeline.phase("close_logs"):
                    log.close()
                with timeline.phase("stop_actors"):
                    self.stop()
        if wait_report:
            self.wait_report()
        return self._write_summary(before, after, steps, engines, started)

    def _write_summary(self, before: float, after: float, steps: int, engines: list[str], started: float) -> dict:
        """summary.json: the accuracy before and after, what ran, its restarts, and where its results are."""
        summary = {
            "eval_accuracy_before": before, "eval_accuracy_after": after,
            "eval_rows": len(self.eval_prompts),
            "eval_accuracy_stderr_after": standard_error(after, len(self.eval_prompts)) if self.eval_prompts else None,
            "steps": steps,
            "mode": self.config.trainer.mode,
            "max_staleness": self.max_staleness,
            "rollout_engine": ",".join(engines),
            "resumed_from_step": None if self.resume is None else self.first_step - 1,
            **{name.replace("/", "_"): int(self.counters[name]) for name in RESTART_COUNTERS},
            "checkpoint": None if self.saved is None else str(self.saved[1]),
            "wall_seconds": round(time.time() - started, 1),
            "run_dir": str(self.run_dir),
            **({} if self.stop_signal is None else {"stopped_by": signal.Signals(self.stop_signal).name}),
            "timeline": self.timeline.summary(),
        }
        write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def finish_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """`summary` with the timeline up to now (launch calls it after Ray has shut down),
        written to summary.json again; the end's breakdown goes to the console."""
        self.wait_report()
        summary = {**summary, "timeline": self.timeline.exit()}
        write_json_atomic(self.run_dir / "summary.json", summary)
        print(Timeline.line("end", self.timeline.end), file=sys.stderr)
        return summary

    def wait_report(self) -> None:
        """Until report.png is written (raises what drawing it raised)."""
        if self.report is not None:
            with self.timeline.phase("report_wait"):
                self.report.result()
            self.report = None

    def request_stop(self, signum: int) -> None:
        """The first SIGINT/SIGTERM: finish the step in progress, save a checkpoint, return."""
        self.stop_signal = signum
        name = signal.Signals(signum).name
        print(f"{name}: finishing the step in progress, then saving a checkpoint (send {name} again to stop now)",
              file=sys.stderr, flush=True)

    def train(self, log: MetricsLog, started: float) -> int:
        """Steps first_step..trainer.steps, or until a stop; returns the last step done."""
        trainer = self.config.trainer
        step = self.first_step - 1
        while step < trainer.steps and self.stop_signal is None:
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
                self.evaluate(step, log)
                self.step_clock = time.perf_counter()  # a step's time leaves the evaluation out
            why = self.failure or (NOT_FINITE if metrics.get("policy/step_skipped") else None)
            self.counters[BAD_STEPS] = self.counters[BAD_STEPS] + 1 if why else 0
            self.first_bad = why if self.counters[BAD_STEPS] == 1 else self.first_bad or why
            out_of_time = bool(trainer.max_wall_seconds) and time.time() - started > trainer.max_wall_seconds
            bad = self.counters[BAD_STEPS] >= trainer.max_bad_steps
            every = trainer.checkpoint_every and step % trainer.checkpoint_every == 0
            if every or step == trainer.steps or out_of_time or bad or self.stop_signal is not None:
                with self.timeline.phase("checkpoint"):
                    self.save(step)
            if bad:
                raise TooManyBadSteps.of(step, trainer.max_bad_steps, self.first_bad, self.saved[1] / "policy")
            if out_of_time:
                log.note(f"stopping after {step} steps: max_wall_seconds={trainer.max_wall_seconds} reached")
                break
        if self.stop_signal is not None:
            log.note(f"stopped by {signal.Signals(self.stop_signal).name} after step {step}")
        self.discard_in_flight()
        self.supervisor.verify_through(self.version)
        return step

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step: hand batch `step` to the learner, push the new weights, submit the
        batch `max_staleness + 1` steps ahead; returns the step's metrics."""
        assert self.pipeline is not None and self.actors is not None
        self.learner_watch.step = step
        self.step_clock = self.step_clock or time.perf_counter()
        counted = {name: self.counters[name] for name in RESTART_COUNTERS}
        self.supervisor.catch_up()
        self.fill(step + self.max_staleness)  # (only the first step has anything to fill here)
        batch = self.in_flight.popleft()
        scored = self.collector.collect(batch, self.version)
        self.supervisor.verify_through(max(scored.versions))  # the weights that sampled it had arrived
        depth = self.pipeline.buffer_depth([batch, *self.in_flight], self.config.rollout.prompts_per_step)
        self.last_group_refs, self.failure = scored.group_refs, scored.failure
        result = None  # dynamic sampling may find no informative group: no update, no new version, no push
        if scored.group_refs:
            result = self.feed.train(scored)
            self.weights.publish(self.version + 1)
        self.fill(step + self.max_staleness + 1)
        learner_metrics = (self.learner_watch.call(result, "train_step") if result is not None
                           else {"policy/version": float(self.version), "time/learn_s": 0.0})
        now = time.perf_counter()
        step_s, self.step_clock = now - self.step_clock, now
        workers = len(self.actors.rollouts)
        return {
            **scored.metrics,
            **learner_metrics,
            **{name: self.counters[name] - counted[name] for name in RESTART_COUNTERS},
            "rollout/buffer_depth": depth,
            "weights/verified_version": float(self.weights.verified),
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

    def rollout(self, prompts: list[Prompt], sampling: SamplingSettings, step: int) -> list[Group]:
        """Generate and score `prompts` now and fetch the groups into the driver (tests, tools)."""
        scored = self.pipeline.collect(self.pipeline.submit(step, prompts, sampling, self.version), self.version)
        return [group for chunk in self.call(scored.group_refs, "reward actors: scored groups") for group in chunk]

    def verify_weights(self) -> None:
        """Every engine serves the learner's weights now (WeightSyncError names those that do not)."""
        self.weights.verify_all()

    # ------------------------------------------------------------ checkpoints

    def save(self, step: int) -> None:
        """A checkpoint of step `step` (once): the learner's share, then the driver's (checkpoints.py)."""
        if self.saved is not None and self.saved[0] == step:
            return
        learner = self.actors.learner
        state = TrainerState(step=step, policy_version=self.version, cursor=self.cursor.state(),
                             counters=dict(self.counters),
                             in_flight=[{"cursor": drawn_at, "prompts": [p.index for p in prompts]}
                                        for drawn_at, prompts in self.drawn_not_trained()])
        path = save_checkpoint(self.run_dir, state, self.config,
                               lambda folder: self.learner_watch.call(learner.save_state.remote(str(folder)), "save_state"),
                               keep=self.config.trainer.keep_checkpoints)
        self.saved = (step, path)

    def check_shared_storage(self) -> None:
        """RunFailed before step 1 when the learner's checkpoint files would not reach RUN_DIR."""
        try:
            check_shared_storage(self.run_dir, lambda path, text: self.learner_watch.call(
                self.actors.learner.write_probe.remote(str(path), text), "write_probe"))
        except CheckpointError as exc:
            raise RunFailed(str(exc)) from None

    def drawn_not_trained(self) -> list[tuple[dict[str, int], list[Prompt]]]:
        """The batches drawn from the cursor and not trained yet, in step order."""
        return [(batch.drawn_at, batch.prompts) for batch in self.in_flight] + list(self.redraw)

    def restore_learner(self) -> None:
        """A resume: the learner continues from the checkpoint, and every engine serves its
        weights (verified, whatever trainer.verify_weight_sync says) before anything is generated."""
        version = self.learner_watch.call(self.actors.learner.load_state.remote(str(self.resume.path)), "load_state")
        if version != self.version:
            raise RunFailed(f"{self.resume.path}: the learner's state is policy version {version}, "
                            f"trainer_state.json says {self.version}")
        self.weights.push_now(self.version)

    # ------------------------------------------------------------ helpers

    def call(self, refs: list[ray.ObjectRef], names: str | list[str]) -> list[Any]:
        """Wait for actor calls, at most trainer.call_timeout_s (waits.fetch)."""
        names = [names] * len(refs) if isinstance(names, str) else names
        return fetch(refs, names, self.config.trainer.call_timeout_s)

    def sample_groups(self, count: int) -> list[Group]:
        """The first `count` groups of the latest batch, fetched into the driver (the samples log)."""
        groups: list[Group] = []
        for ref in self.last_group_refs:
            if len(groups) >= count:
                break
            groups += self.call([ref], "reward actor: scored groups")[0]
        return groups

    def evaluate(self, step: int, log: MetricsLog) -> float:
        """Greedy accuracy on the held-out rows (evaluation.evaluate, as `python -m grpo_dist.eval` runs it).

        Its engine calls queue behind the latest weight push, so it measures version `self.version`.
        An actor that dies or hangs during it is revived (a hung one killed first) and the evaluation
        runs again.
        """
        if not self.eval_prompts:
            return float("nan")
        for attempt in itertools.count():
            self.supervisor.catch_up()
            try:
                metrics = evaluate(self.actors.rollouts, self.actors.rewards, self.eval_prompts, self.config)
                break
            except (ActorLost, ObjectLost) as lost:  # an actor died, or a node with its results
                where = self.supervisor.which(lost)
                if attempt >= self.config.cluster.max_restarts or (where is None and isinstance(lost, ActorLost)):
                    raise
                log.note(f"evaluation at step {step}: {first_line(lost)}; evaluating again")
                if where is not None:
                    self.supervisor.revive(*where)  # (else catch_up, above, finds the restarted actors)
            except CallTimeout as late:  # an actor hung: killed and revived, or the run ends
                if attempt >= self.config.cluster.max_restarts or not self.supervisor.kill_unresponsive(
                        str(late), grace_s=self.config.trainer.call_timeout_s):
                    raise
                log.note(f"evaluation at step {step}: {late}; the actors that hung were restarted; evaluating again")
        log.log_eval(step, metrics)
        return metrics["eval/accuracy"]
