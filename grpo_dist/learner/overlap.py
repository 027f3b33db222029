"""An overlapped sync step on the learner's side: the chunks learn_chunk took, in order.

The controller (controller/overlap.py) hands the learner each scored chunk as soon as it is
scored (`Learner.learn_chunk`), then the whole batch's references (`Learner.finish_step`).
Advantages are per group and a chunk holds whole groups, so a chunk's are the batch's. pi_ref
and pi_old of a row depend on that row alone. The gradient pass is the only part that needs
the whole batch, through the loss divisor D (grpo.loss_denominator): every micro-batch's loss
is num / D, so summing the micro-batches' num (D = 1) and dividing the gradient by D once the
last chunk is in gives the same gradient up to float rounding, whichever the aggregation
(token_mean's D, the batch's tokens, is only known then).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.metrics import StepStats
from grpo_dist.common.types import Group


@dataclass
class ChunkedStep:
    """The chunks of the step in progress: their keys, batches (pi_ref and pi_old filled in),
    groups, and the statistics of their gradient pass when it ran (`accumulated`)."""

    accumulated: bool  # the gradient pass ran on each chunk (one optimizer step per batch)
    whole: bool = False  # one chunk, the whole batch (train_step): a single step's gradient pass fills pi_old
    keys: list[str] = field(default_factory=list)
    parts: list[TrainBatch] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    stats: StepStats = field(default_factory=StepStats)
    learn_started: float = field(default_factory=time.time)  # unix seconds: the first chunk's start
    busy_s: float = 0.0  # seconds spent in learn_chunk

    def add(self, key: str, part: TrainBatch, groups: list[Group], seconds: float) -> None:
        self.keys.append(key)
        self.parts.append(part)
        self.groups += groups
        self.busy_s += seconds


def divide_grads(params: list[torch.nn.Parameter], denominator: float) -> None:
    """Every gradient divided by the batch's D: the gradients of sums become those of the loss."""
    for param in params:
        if param.grad is not None:
            param.grad.div_(denominator)
