"""The learning-rate schedule: linear warmup, then constant, linear or cosine decay.

The schedule counts GRPO steps (train_step calls, policy versions), not optimizer steps:
every optimizer step of one GRPO step (algo.mu passes x minibatches) uses the same rate, so
`trainer.steps` is the schedule's length whatever mu and minibatch_size are. At step k
(0-based) of N = trainer.steps with W warmup steps, lr_k = algo.lr * f(k):

    warmup    f(k) = (k + 1) / W                                   k < W
    constant  f(k) = 1                                             k >= W
    linear    f(k) = 1 - p,               p = (k - W) / (N - W)
    cosine    f(k) = (1 + cos(pi p)) / 2

so the first step already trains (at lr / W), and the last step's rate is above 0.
"""

from __future__ import annotations

import math

import torch

from grpo_dist.config.schema import AlgoConfig


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """f(k) above: the multiplier of algo.lr at GRPO step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r}")


def make_scheduler(optimizer: torch.optim.Optimizer, algo: AlgoConfig,
                   total_steps: int | None) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over GRPO steps; the learner calls `step()` once per train_step.

    `total_steps` (trainer.steps) may be None only for a constant schedule.
    """
    if total_steps is None and algo.lr_schedule != "constant":
        raise ValueError(f"algo.lr_schedule={algo.lr_schedule!r} decays over the run: the learner needs its "
                         "trainer.steps (total_steps)")
    total = total_steps or 1
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, algo.lr_schedule, algo.warmup_steps, total))
