"""A training run from start to end: the actors started and stopped, the step loop (loop.py)
run between the evaluations before and after, the final save, report.png and summary.json.

    TrainingRun(config, run_dir).run()   -> summary.json's dict

launch.py makes one (the actors already started while the data were read) and calls `run`,
then `finish_summary` once Ray has shut down; SIGINT/SIGTERM stop the run cleanly (signals.py).
The parts it wires together, each holding only what it uses: the weight transport and its
WeightPublisher (publish.py), the Supervisor (recovery.py), the Checkpointer (checkpointing.py),
the Evaluator (evaluator.py) and the StepLoop (loop.py).
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from grpo_dist.common.atomic import write_json_atomic
from grpo_dist.config.schema import Config, dump_config
from grpo_dist.controller.actors import Actors, LearnerWatch
from grpo_dist.controller.checkpointing import Checkpointer, start_point
from grpo_dist.controller.resume import Checkpoint
from grpo_dist.controller.errors import writing
from grpo_dist.controller.evaluator import Evaluator
from grpo_dist.controller.loop import StepLoop
from grpo_dist.controller.publish import WeightPublisher
from grpo_dist.controller.recovery import RESTART_COUNTERS, Supervisor
from grpo_dist.controller.retry import Retry
from grpo_dist.controller.signals import StopRequest, stop_on_signals
from grpo_dist.tasks.data import PreparedData, prepare_data
from grpo_dist.observe.evaluation import standard_error
from grpo_dist.observe.metrics import MetricsLog
from grpo_dist.observe.plots import report_thread, write_report_beside
from grpo_dist.observe.timeline import Timeline
from grpo_dist.common.waits import fetch
from grpo_dist.weights import WeightSync, make_weight_sync


class TrainingRun:
    """Runs GRPO for `config.trainer.steps` steps and writes the run directory.

    What tests and tools may use besides `run`: `start`/`stop`, `verify_weights()`, and after
    `start` the parts it wires together: `actors` (the handles), `transport`, `publisher`,
    `supervisor`, `checkpointer` and `loop` (the StepLoop: `step(n)`, `rollout(...)`, `pipeline`, ...).
    """

    def __init__(self, config: Config, run_dir: Path, data: PreparedData | None = None,
                 resume: Checkpoint | None = None, timeline: Timeline | None = None,
                 actors: Actors | None = None) -> None:
        """`data`: the prompts launch prepared while Ray started; prepared here when not given.
        `actors`: created by launch while the data were read (`Actors.create`); else by `start`.
        `resume`: the checkpoint to continue from; its data cursor is restored here (CheckpointError
        when this run's data differ). `timeline`: the run's start and end (launch's, from the command)."""
        self.config, self.run_dir, self.resume = config, run_dir, resume
        self.timeline = timeline or Timeline()
        data = data if data is not None else prepare_data(config)
        self.eval_prompts = data.eval
        self.start_point = start_point(resume, data.train, config.trainer.seed)
        self.actors = actors
        self.stop_request = StopRequest()
        self.transport: WeightSync | None = None
        self.learner_watch: LearnerWatch | None = None
        self.publisher: WeightPublisher | None = None
        self.supervisor: Supervisor | None = None
        self.checkpointer: Checkpointer | None = None
        self.evaluator: Evaluator | None = None
        self.loop: StepLoop | None = None
        self.report: Future | None = None  # report.png, drawn in a thread while the actors and Ray stop

    @property
    def stop_signal(self) -> int | None:
        """The first SIGINT/SIGTERM received, None when none was."""
        return self.stop_request.signum

    def start(self, weight_sync: Callable[[Config, Any, list[Any]], WeightSync] = make_weight_sync) -> None:
        """Start the actors and the weight transport (`trainer.weight_sync`, built by `weight_sync`),
        and wire the parts that drive them."""
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
        start, actors = self.start_point, self.actors
        watch = self.learner_watch = LearnerWatch(actors.learner, trainer.call_timeout_s, self.transport)
        self.supervisor = Supervisor({"rollout": actors.rollouts, "reward": actors.rewards}, watch,
                                     max_restarts=config.cluster.max_restarts,
                                     start_timeout_s=config.cluster.actor_start_timeout_s, counters=start.counters)
        retry = Retry(self.supervisor)
        self.publisher = WeightPublisher(self.transport, watch, actors.rollouts, retry,
                                         verify=trainer.verify_weight_sync, timeout_s=trainer.call_timeout_s,
                                         version=start.version)
        self.checkpointer = Checkpointer(config, self.run_dir, watch, self.resume)
        self.evaluator = Evaluator(config, self.eval_prompts, actors.rollouts, actors.rewards, retry, self.publisher)
        self.loop = StepLoop(config, start, actors, retry, self.supervisor.counters, self.publisher, watch,
                             self.evaluator, self.checkpointer, self.timeline, self.stop_request)

    def stop(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.actors is not None:
            self.actors.stop()

    def verify_weights(self) -> None:
        """Every engine serves the learner's weights now (WeightSyncError names those that do not)."""
        self.publisher.verify_all()

    def run(self, wait_report: bool = True) -> dict[str, Any]:
        """Train, evaluate and save; the summary says `stopped_by` when a signal stopped the run.
        With `wait_report` False report.png may still be drawn when this returns: `finish_summary`
        waits for it (launch: while Ray shuts down)."""
        started = time.time()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with writing(self.run_dir / "config.yaml"):
            (self.run_dir / "config.yaml").write_text(dump_config(self.config))
        with writing(self.run_dir):
            records = self.resume.restore_metrics(self.run_dir) if self.resume is not None else []
        started -= records[-1]["wall_s"] if records else 0.0  # wall_s goes on from where the run was
        before = next((r["eval/accuracy"] for r in records if r["kind"] == "eval" and r["step"] == 0), math.nan)
        timeline, resumed_from = self.timeline, self.resumed_from()
        with timeline.phase("loggers"):
            log = MetricsLog(self.run_dir, self.config, started, resumed_from)
        with stop_on_signals(self.stop_request):
            self.start()
            try:
                with timeline.phase("describe_and_storage_check"):
                    described = fetch([w.describe.remote() for w in self.actors.rollouts],
                                      ["rollout workers: describe"] * len(self.actors.rollouts),
                                      self.config.trainer.call_timeout_s)
                    engines = sorted({d["engine"] for d in described})
                    self.checkpointer.check_shared_storage()
                if self.resume is None:
                    with timeline.phase("first_weight_check"):
                        self.verify_weights()
                    with timeline.phase("eval_before"):
                        before = self.evaluator.evaluate(step=0, log=log)
                else:
                    with timeline.phase("restore"):
                        self.checkpointer.restore_learner(self.publisher)
                steps = self.loop.train(log, started)
                timeline.ending()  # (already, after the last step; an early stop ends here)
                after = self.finish(steps, log)
            finally:
                with timeline.phase("close_logs"):
                    log.close()
                with timeline.phase("stop_actors"):
                    self.stop()
        if wait_report:
            self.wait_report()
        return self._write_summary(before, after, steps, engines, started)

    def finish(self, steps: int, log: MetricsLog) -> float:
        """After the last step: the final evaluation (its accuracy; NaN after a stop), report.png
        started, the final policy saved (trainer.save_final)."""
        after = math.nan
        drawing = report_thread()  # matplotlib is imported while the final evaluation runs
        if self.stop_signal is None:
            with self.timeline.phase("eval_after"):
                after = self.evaluator.evaluate(step=steps, log=log)
            self.timeline.mark("final_eval_done")
        self.report = write_report_beside(self.run_dir, drawing)  # metrics.jsonl is complete
        if self.stop_signal is None and self.config.trainer.save_final:
            with self.timeline.phase("save_final"):
                self.learner_watch.call(self.actors.learner.save.remote(str(self.run_dir / "final")), "save")
        return after

    def resumed_from(self) -> int | None:
        """The step of the checkpoint this run resumes from, None for a fresh run."""
        return None if self.resume is None else self.start_point.first_step - 1

    def _write_summary(self, before: float, after: float, steps: int, engines: list[str], started: float) -> dict:
        """summary.json: the accuracy before and after, what ran, its restarts, and where its results are."""
        saved, counters = self.checkpointer.saved, self.supervisor.counters
        summary = {
            "eval_accuracy_before": before, "eval_accuracy_after": after,
            "eval_rows": len(self.eval_prompts),
            "eval_accuracy_stderr_after": standard_error(after, len(self.eval_prompts)) if self.eval_prompts else None,
            "steps": steps,
            "mode": self.config.trainer.mode,
            "max_staleness": self.loop.max_staleness,
            "rollout_engine": ",".join(engines),
            "resumed_from_step": self.resumed_from(),
            **{name.replace("/", "_"): int(counters[name]) for name in RESTART_COUNTERS},
            "checkpoint": None if saved is None else str(saved[1]),
            "wall_seconds": round(time.time() - started, 1),
            "run_dir": str(self.run_dir),
            **({} if self.stop_signal is None else {"stopped_by": signal.Signals(self.stop_signal).name}),
            "timeline": self.timeline.summary(),
        }
        with writing(self.run_dir / "summary.json"):
            write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def finish_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """`summary` with the timeline up to now (launch calls it after Ray has shut down),
        written to summary.json again; the end's breakdown goes to the console."""
        self.wait_report()
        summary = {**summary, "timeline": self.timeline.exit()}
        with writing(self.run_dir / "summary.json"):
            write_json_atomic(self.run_dir / "summary.json", summary)
        print(Timeline.line("end", self.timeline.end), file=sys.stderr)
        return summary

    def wait_report(self) -> None:
        """Until report.png is written (raises what drawing it raised)."""
        if self.report is not None:
            with self.timeline.phase("report_wait"), writing(self.run_dir / "report.png"):
                self.report.result()
            self.report = None
