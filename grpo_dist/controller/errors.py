"""What ends a run: each failure the controller can meet, and the exit code launch gives it.

Exit code 1 (launch prints one line, then where to resume from): the run started and cannot
go on. Exit code 2 (`StartError` and the config, data and checkpoint errors): it could not
start, and nothing was started or written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from grpo_dist.common.waits import CallTimeout
from grpo_dist.weights.errors import WeightSyncError


class StartError(RuntimeError):
    """The run cannot start; the message says why (exit code 2)."""


class RunFailed(RuntimeError):
    """The run cannot go on; the message says why (launch adds where to resume from; exit 1)."""


class LearnerLost(RunFailed):
    """The learner's process died: its state is gone, so the run ends (the learner is never restarted)."""


NOT_FINITE = "a loss or gradient that is not finite (the step was skipped)"


class TooManyBadSteps(RunFailed):
    """trainer.max_bad_steps steps in a row trained on nothing: a non-finite loss or gradient, or
    every sample failed (every episode, or one reward function on every completion)."""

    @classmethod
    def of(cls, step: int, max_bad_steps: int, first: str | None, weights: Path) -> TooManyBadSteps:
        """The error after step `step`, the last of the run of bad steps; `first`: why the first was bad."""
        steps = f"steps {step - max_bad_steps + 1}-{step}"
        if first is None or first == NOT_FINITE:
            return cls(f"{steps} had a loss or gradient that is not finite (trainer.max_bad_steps={max_bad_steps} "
                       f"in a row; each was skipped); the last good weights are in {weights}: start from them "
                       "(model.path) with a lower algo.lr or algo.max_grad_norm")
        return cls(f"{steps} trained on nothing (trainer.max_bad_steps={max_bad_steps} in a row): {first}")


class OutputFailed(RunFailed):
    """A file of the run's output (metrics.jsonl, samples.jsonl, TensorBoard's events, config.yaml,
    report.png, summary.json) could not be written, a full disk say: nothing written since the
    last checkpoint is needed to resume from it."""


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """What is written inside: an OSError becomes OutputFailed, naming `path`."""
    try:
        yield
    except OSError as exc:
        raise OutputFailed(f"could not write {path}: {exc}") from exc


class ActorGone(RunFailed):
    """An actor died once more than Ray restarts it (`cluster.max_restarts`), or did not come back in time."""


class ChunkFailed(RunFailed):
    """A chunk was lost, or sampled by the wrong weights, more often than `cluster.max_restarts` + 1."""


class NotPlaced(RunFailed):
    """The cluster did not place every actor within cluster.actor_start_timeout_s."""


# What ends a started run with a message and exit code 1 (launch.py).
FAILURES = (RunFailed, CallTimeout, WeightSyncError)
