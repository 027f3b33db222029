"""What one learner step reports: loss and policy statistics, sampler agreement.

Names follow the project's metric table: `loss/...`, `policy/...`, `rollout/...`, `system/...`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from grpo_dist import grpo
from grpo_dist.learner.distributed import DataParallel


class StepStats:
    """Statistics of one train_step, gathered micro-batch by micro-batch, exact for any split.

    Token means (KL, clip fraction, ratio, entropy) are weighted by each micro-batch's
    completion tokens; losses are summed within an optimizer step (every micro-batch's loss
    is already divided by the whole minibatch's D) and averaged over the steps. The sums stay
    tensors on the learner's device, read on the host once per optimizer step (`sum_losses`)
    and once per train_step (`sum_tokens`): a micro-batch adds no host sync.
    """

    TOKEN_MEANS = {"kl": "loss/kl", "clip_fraction": "policy/clip_fraction", "ratio_mean": "policy/ratio_mean",
                   "entropy": "policy/entropy"}

    def __init__(self) -> None:
        self.tokens = 0.0
        self.token_sums = dict.fromkeys(self.TOKEN_MEANS, 0.0)
        self.ratio_min, self.ratio_max = math.inf, -math.inf
        self.loss = self.policy_loss = 0.0  # of the optimizer step in progress (floats after sum_losses)
        self.updates: list[tuple[float, float, float, bool]] = []  # (loss, policy loss, grad norm, skipped)
        # on the device until read: [loss, policy loss] of the optimizer step in progress, and
        # [tokens, *token_sums, -ratio_min, ratio_max] of the whole train_step
        self.step_sums: torch.Tensor | None = None
        self.token_parts: torch.Tensor | None = None
        self.stage_s = dict.fromkeys(self.STAGES, 0.0)  # seconds in each of the learner's stages

    # where a step's learning time goes (time/learner_<stage>_s): the no-grad pi_ref and pi_old
    # passes, the forward and backward of the loss, the gradient clip and AdamW step
    STAGES = ("reference_pass", "old_pass", "grad_pass", "optimizer")

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the seconds of the `with` block to `stage` (one of STAGES)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.stage_s[stage] += time.perf_counter() - began

    def add_micro_batch(self, loss: torch.Tensor, stats: dict[str, torch.Tensor], entropy: torch.Tensor,
                        mask: torch.Tensor) -> None:
        """A micro-batch's loss and grpo.policy_loss_terms statistics, all 0-dim tensors: added on the device."""
        valid = mask.bool()
        tokens = valid.sum().to(torch.float64)
        entropy_mean = torch.where(valid, entropy.detach(), 0.0).sum() / tokens.clamp(min=1)
        stats = {**stats, "entropy": entropy_mean}
        some = tokens > 0  # an empty micro-batch leaves the ratio range alone
        parts = torch.stack([tokens, *(stats[key].to(torch.float64) * tokens for key in self.TOKEN_MEANS),
                             torch.where(some, -stats["ratio_min"].to(torch.float64), -math.inf),
                             torch.where(some, stats["ratio_max"].to(torch.float64), -math.inf)])
        if self.token_parts is None:
            self.token_parts = parts
        else:  # sums, and maxima of (-min, max)
            self.token_parts = torch.cat([self.token_parts[:-2] + parts[:-2],
                                          torch.maximum(self.token_parts[-2:], parts[-2:])])
        losses = torch.stack([loss.detach(), stats["policy_loss"]]).to(torch.float64)
        self.step_sums = losses if self.step_sums is None else self.step_sums + losses

    def sum_losses(self, ranks: DataParallel) -> None:
        """The optimizer step's loss: the sum of every rank's part (each already divided by the
        global D), read on the host here, once per optimizer step."""
        losses = torch.zeros(2, dtype=torch.float64) if self.step_sums is None else self.step_sums
        self.loss, self.policy_loss = ranks.sum(losses).tolist()
        self.step_sums = None

    def divide_losses(self, denominator: float) -> None:
        """The optimizer step's losses, summed with D = 1 (an overlapped step, learner/overlap.py), divided by D."""
        if self.step_sums is not None:
            self.step_sums = self.step_sums / denominator

    def sum_tokens(self, ranks: DataParallel) -> None:
        """Token counts and token-weighted sums of every rank, and the ratio range over all of them."""
        if self.token_parts is not None:
            parts = self.token_parts.tolist()  # the one read of the step's token statistics
            self.tokens = parts[0]
            self.token_sums = dict(zip(self.token_sums, parts[1:-2]))
            self.ratio_min, self.ratio_max = -parts[-2], parts[-1]
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
            **{f"time/learner_{stage}_s": seconds for stage, seconds in self.stage_s.items()},
        }


def advantage_metrics(advantages: torch.Tensor) -> dict[str, float]:
    return {
        "policy/advantage_mean": advantages.mean().item(),
        "policy/advantage_std": advantages.std().item() if len(advantages) > 1 else 0.0,
        "policy/advantage_zero_fraction": (advantages == 0).float().mean().item(),
    }


def sampler_agreement(mask: torch.Tensor, sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                      tis_cap: float | None) -> dict[str, float]:
    """How far the sampler's logprobs are from the learner's for the same tokens: |difference|,
    mismatch_kl (k3 estimate of KL(pi_sampler || pi_learner) on the sampler's own tokens), and
    the importance weights pi_learner / pi_sampler that this gap implies."""
    valid = mask.bool()
    diff = (sampler_logprobs - learner_logprobs)[valid].abs()
    mismatch = grpo.kl_k3(sampler_logprobs, learner_logprobs)[valid]
    weights = grpo.importance_weight_stats(learner_logprobs, sampler_logprobs, mask, tis_cap)
    return {"rollout/logprob_diff_abs_mean": diff.mean().item() if diff.numel() else 0.0,
            "rollout/logprob_diff_abs_max": diff.max().item() if diff.numel() else 0.0,
            "rollout/mismatch_kl": mismatch.mean().item() if mismatch.numel() else 0.0,
            **{f"rollout/{name}": value for name, value in weights.items()}}

