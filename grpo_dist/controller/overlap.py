"""How the controller hands a batch to the learner: whole (train_step), or chunk by chunk.

Overlap inside a sync step (trainer.overlap_learning, config.resolve_overlap): sync mode stays
exactly on-policy, but the learner need not wait for the whole batch:

    submit batch t (pipeline.py)        its chunks: rollout -> reward, as always
    learner.learn_chunk(ref, key)       one per chunk, submitted at once; queued behind step t - 1's
                                        update and weight export (Ray runs one caller's calls to an
                                        actor in order), each runs when its chunk is scored
    collect batch t                     the driver waits for the small stats, as always
    learner.finish_step(*refs, keys)    the one optimizer step, after the last chunk

A chunk's key is its scored groups' object reference. A chunk the pipeline sent again (a
worker died, or the wrong weights sampled it) has a new reference: the learner, finding other
keys than it took, drops what it did and learns the final references afresh, chunk by chunk in
order, as a calm step does: a replayed step is the calm step to the bit (`policy/overlap_fallback`).
learner/overlap.py has why the update is train_step's.
"""

from __future__ import annotations

from typing import Any

import ray

from grpo_dist.controller.batches import Batch, ScoredBatch


class LearnerFeed:
    """The learner's side of a step for the loop: `submitted(batch)` when a batch is submitted,
    `train(scored)` once it is collected (the reference of the step's metrics)."""

    def __init__(self, learner: Any, overlap: bool) -> None:
        self.learner, self.overlap = learner, overlap

    def submitted(self, batch: Batch) -> None:
        """With overlap, every chunk of `batch` goes to the learner now, to be learned once scored."""
        if self.overlap:
            for chunk in batch.chunks:
                self.learner.learn_chunk.remote(chunk.scored, chunk.scored.hex())

    def train(self, scored: ScoredBatch) -> ray.ObjectRef:
        if self.overlap:
            return self.learner.finish_step.remote(*scored.group_refs, keys=[ref.hex() for ref in scored.group_refs])
        return self.learner.train_step.remote(*scored.group_refs, max_groups=scored.max_groups)
