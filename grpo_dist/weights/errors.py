"""The error every weight transport raises, in a module of its own so that the transports
(object_store.py, nccl.py) and the controller import it without importing each other."""


class WeightSyncError(RuntimeError):
    """A rollout worker serves weights other than the learner's: stale weights are an error."""
