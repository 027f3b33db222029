"""The run's checkpoints from the controller's side: where a run starts, and saving and restoring its state.

checkpoints.py writes the files atomically, resume.py finds, checks and reads them back; this
module decides what goes into them: the driver's share (TrainerState: step, version, data cursor, the batches drawn
but not trained, the run totals) beside the learner's, and restores both on a resume.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from grpo_dist.config.schema import Config
from grpo_dist.controller.actors import LearnerWatch
from grpo_dist.controller.checkpoints import TrainerState, check_shared_storage, save_checkpoint
from grpo_dist.controller.errors import RunFailed
from grpo_dist.controller.manifest import CheckpointError
from grpo_dist.controller.publish import WeightPublisher
from grpo_dist.controller.resume import Checkpoint
from grpo_dist.tasks.data import PromptCursor
from grpo_dist.common.types import Prompt

BAD_STEPS = "bad_steps_in_a_row"  # kept with the restart counters in checkpoints

Drawn = tuple[dict[str, int], list[Prompt]]  # a batch drawn from the cursor: where it was drawn, its prompts


@dataclass
class StartPoint:
    """Where a run starts: its first step, the learner's policy version, the data cursor, the
    batches drawn but not trained (a resume's go first) and the run totals (restarts, bad steps)."""

    first_step: int
    version: int
    cursor: PromptCursor
    redraw: deque[Drawn] = field(default_factory=deque)
    counters: dict[str, float] = field(default_factory=lambda: {BAD_STEPS: 0.0})


def start_point(resume: Checkpoint | None, prompts: list[Prompt], seed: int) -> StartPoint:
    """Step 1 of a fresh run, or the step after `resume`'s with its cursor, batches and totals
    (CheckpointError when this run's data differ from the checkpoint's)."""
    if resume is None:
        return StartPoint(first_step=1, version=0, cursor=PromptCursor(prompts, seed))
    cursor, batches = resume.restore_data(prompts, seed)
    start = StartPoint(first_step=resume.state.step + 1, version=resume.state.policy_version, cursor=cursor,
                       redraw=deque(batches))
    start.counters.update(resume.state.counters)
    return start


class Checkpointer:
    """Saves a step's checkpoint (the learner's share, then the driver's) and restores the
    learner from the checkpoint a run resumes; `saved` is the latest one's step and path."""

    def __init__(self, config: Config, run_dir: Path, learner_watch: LearnerWatch,
                 resume: Checkpoint | None) -> None:
        self.config, self.run_dir, self.learner_watch, self.resume = config, run_dir, learner_watch, resume
        self.saved: tuple[int, Path] | None = None

    def save(self, state: TrainerState) -> None:
        """A checkpoint of step `state.step` (once): the learner's share, then the driver's (checkpoints.py)."""
        if self.saved is not None and self.saved[0] == state.step:
            return
        watch = self.learner_watch
        path = save_checkpoint(self.run_dir, state, self.config,
                               lambda folder: watch.call(watch.actor.save_state.remote(str(folder)), "save_state"),
                               keep=self.config.trainer.keep_checkpoints)
        self.saved = (state.step, path)

    def check_shared_storage(self) -> None:
        """RunFailed before step 1 when the learner's checkpoint files would not reach RUN_DIR."""
        try:
            check_shared_storage(self.run_dir, lambda path, text: self.learner_watch.call(
                self.learner_watch.actor.write_probe.remote(str(path), text), "write_probe"))
        except CheckpointError as exc:
            raise RunFailed(str(exc)) from None

    def restore_learner(self, publisher: WeightPublisher) -> None:
        """A resume: the learner continues from the checkpoint, and every engine serves its
        weights (verified, whatever trainer.verify_weight_sync says) before anything is generated."""
        assert self.resume is not None
        learner = self.learner_watch.actor
        version = self.learner_watch.call(learner.load_state.remote(str(self.resume.path)), "load_state")
        if version != publisher.version:
            raise RunFailed(f"{self.resume.path}: the learner's state is policy version {version}, "
                            f"trainer_state.json says {publisher.version}")
        publisher.push_now(publisher.version)


def driver_state(step: int, version: int, cursor: PromptCursor, counters: dict[str, float],
                 drawn_not_trained: list[Drawn]) -> TrainerState:
    """The driver's share of step `step`'s checkpoint: the batches drawn but not trained by their prompts' rows."""
    return TrainerState(step=step, policy_version=version, cursor=cursor.state(), counters=dict(counters),
                        in_flight=[{"cursor": drawn_at, "prompts": [p.index for p in prompts]}
                                   for drawn_at, prompts in drawn_not_trained])

