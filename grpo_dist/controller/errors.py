"""What ends a run: each failure the controller can meet, and the exit code launch gives it.

Exit code 1 (launch prints one line, then where to resume from): the run started and cannot
go on. Exit code 2 (`StartError` and the config, data and checkpoint errors): it could not
start, and nothing was started or written.
"""

from __future__ import annotations

from grpo_dist.waits import CallTimeout
from grpo_dist.weights.errors import WeightSyncError


class StartError(RuntimeError):
    """The run cannot start; the message says why (exit code 2)."""


class RunFailed(RuntimeError):
    """The run cannot go on; the message says why (launch adds where to resume from; exit 1)."""


class LearnerLost(RunFailed):
    """The learner's process died: its state is gone, so the run ends (the learner is never restarted)."""


class TooManyBadSteps(RunFailed):
    """trainer.max_bad_steps steps in a row had a non-finite loss or gradient."""


class ActorGone(RunFailed):
    """An actor died once more than Ray restarts it (`cluster.max_restarts`), or did not come back in time."""


class ChunkFailed(RunFailed):
    """A chunk was lost, or sampled by the wrong weights, more often than `cluster.max_restarts` + 1."""


class NotPlaced(RunFailed):
    """The cluster did not place every actor within cluster.actor_start_timeout_s."""


# What ends a started run with a message and exit code 1 (launch.py).
FAILURES = (RunFailed, CallTimeout, WeightSyncError)
