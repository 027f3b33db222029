"""What one learner step reports: loss and policy statistics, sampler agreement.

Names follow the project's metric table: `loss/...`, `policy/...`, `rollout/...`, `system/...`.
"""

from __future__ import annotations

import math

import torch

from grpo_dist import grpo
from grpo_dist.learner.distributed import DataParallel


class StepStats:
    """Statistics of one train_step, gathered micro-batch by micro-batch, exact for any split.

    Token means (KL, clip fraction, ratio, entropy) are weighted by each micro-batch's
    completion tokens; losses are summed within an optimizer step (every micro-batch's loss
    is already divided by the whole minibatch's D) and averaged over the steps.
    """

    TOKEN_MEANS = {"kl": "loss/kl", "clip_fraction": "policy/clip_fraction", "ratio_mean": "policy/ratio_mean",
                   "entropy": "policy/entropy"}

    def __init__(self) -> None:
        self.tokens = 0.0
        self.token_sums = dict.fromkeys(self.TOKEN_MEANS, 0.0)
        self.ratio_min, self.ratio_max = math.inf, -math.inf
        self.loss = self.policy_loss = 0.0  # of the optimizer step in progress
        self.updates: list[tuple[float, float, float, bool]] = []  # (loss, policy loss, grad norm, skipped)

    def add_micro_batch(self, loss: torch.Tensor, stats: dict[str, float], entropy: torch.Tensor,
                        mask: torch.Tensor) -> None:
        valid = mask.bool()
        tokens = float(valid.sum())
        stats = {**stats, "entropy": entropy[valid].mean().item() if tokens else 0.0}
        for key in self.TOKEN_MEANS:
            self.token_sums[key] += stats[key] * tokens
        self.tokens += tokens
        if tokens:
            self.ratio_min, self.ratio_max = min(self.ratio_min, stats["ratio_min"]), max(self.ratio_max, stats["ratio_max"])
        self.loss += loss.item()
        self.policy_loss += stats["policy_loss"]

    def sum_losses(self, ranks: DataParallel) -> None:
        """The optimizer step's loss: the sum of every rank's part (each already divided by the global D)."""
        losses = ranks.sum(torch.tensor([self.loss, self.policy_loss], dtype=torch.float64))
        self.loss, self.policy_loss = losses.tolist()

    def sum_tokens(self, ranks: DataParallel) -> None:
        """Token counts and token-weighted sums of every rank, and the ratio range over all of them."""
        sums = ranks.sum(torch.tensor([self.tokens, *self.token_sums.values()], dtype=torch.float64)).tolist()
        self.tokens, self.token_sums = sums[0], dict(zip(self.token_sums, sums[1:]))
        self.ratio_min, self.ratio_max = ranks.min_max(self.ratio_min, self.ratio_max)

    def end_update(self, grad_norm: float, skipped: bool) -> None:
        self.updates.append((self.loss, self.policy_loss, grad_norm, skipped))
        self.loss = self.policy_loss = 0.0

    def metrics(self) -> dict[str, float]:
        count = len(self.updates)
        skipped = sum(update[3] for update in self.updates)
        return {
            "loss/total": sum(update[0] for update in self.updates) / count,
            "loss/policy": sum(update[1] for update in self.updates) / count,
            **{name: self.token_sums[key] / max(self.tokens, 1.0) for key, name in self.TOKEN_MEANS.items()},
            "policy/ratio_min": self.ratio_min if self.tokens else 1.0,
            "policy/ratio_max": self.ratio_max if self.tokens else 1.0,
            "policy/grad_norm": sum(update[2] for update in self.updates) / count,
            "policy/skipped_steps": float(skipped),
            "policy/step_skipped": float(skipped > 0),
        }


def advantage_metrics(advantages: torch.Tensor) -> dict[str, float]:
    return {
        "policy/advantage_mean": advantages.mean().item(),
        "policy/advantage_std": advantages.std().item() if len(advantages) > 1 else 0.0,
        "policy/advantage_zero_fraction": (advantages == 0).float().mean().item(),
    }


def sampler_agreement(mask: torch.Tensor, sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                      tis_cap: float | None) -> dict[str, float]:
    """How far the sampler's logprobs are from the learner's for the same tokens, and the
    importance weights pi_learner / pi_sampler that this gap implies."""
    valid = mask.bool()
    diff = (sampler_logprobs - learner_logprobs)[valid].abs()
    weights = grpo.importance_weight_stats(learner_logprobs, sampler_logprobs, mask, tis_cap)
    return {"rollout/logprob_diff_mean": diff.mean().item() if diff.numel() else 0.0,
            "rollout/logprob_diff_max": diff.max().item() if diff.numel() else 0.0,
            **{f"rollout/{name}": value for name, value in weights.items()}}

