"""The GRPO algorithm: pure functions on tensors. No Ray, no I/O, no models.

Notation (one prompt q, a group of G completions o_1..o_G with rewards r_1..r_G):

    A_i   = (r_i - mean(r)) / (std(r) + eps)                 group-relative advantage
    rho_t = exp(log pi_theta(o_t) - log pi_old(o_t))         importance ratio per token
    L_t   = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A) + beta * KL_t
    KL_t  = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1   (k3, >= 0)

and the per-token losses L_t are averaged over the batch in one of three ways
(`aggregation`), which is where GRPO, DAPO and Dr. GRPO differ.

The sampler (vLLM) and the learner compute pi_old differently, so the tokens were drawn
from a slightly different pi_sampler. Truncated importance sampling (TIS) corrects that:

    w_t   = min(exp(log pi_old(o_t) - log pi_sampler(o_t)), C)   C = tis_cap
    L_t   = w_t * -min(rho_t A, clip(rho_t) A) + beta * KL_t
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageScale = Literal["std", "none"]
Aggregation = Literal["token_mean", "sequence_mean", "constant"]


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: AdvantageScale = "std", eps: float = 1e-6
) -> torch.Tensor:
    """Advantages of N*G rewards, each run of `group_size` consecutive values one group.

    A group whose rewards are all equal gets zero advantages (no NaN): it carries no
    signal about which completion was better.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be 1-D with a multiple of {group_size} values, got {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # r_i - mean(r)
    if scale == "none":  # Dr. GRPO: no division by the std
        return centered.flatten()
    if scale != "std":
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    std = grouped.std(dim=1, keepdim=True)  # Bessel-corrected sample std
    return (centered / (std + eps)).flatten()  # (r_i - mean(r)) / (std(r) + eps)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per token: unbiased and >= 0."""
    log_ratio = ref_logprobs - logprobs  # log pi_ref - log pi_theta
    return torch.exp(log_ratio) - log_ratio - 1


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation, max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce [B, T] per-token values under `mask` to a scalar."""
    mask = mask.to(per_token.dtype)
    masked_sum = (per_token * mask).sum()
    if aggregation == "token_mean":  # DAPO: every token in the batch weighs the same
        return masked_sum / mask.sum().clamp(min=1)
    if aggregation == "sequence_mean":  # DeepSeekMath GRPO: every sequence weighs the same
        per_sequence = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_sequence.mean()
    if aggregation == "constant":  # Dr. GRPO: a fixed divisor, no length bias
        if max_tokens is None:
            raise ValueError("aggregation='constant' needs max_tokens")
        return masked_sum / (per_token.shape[0] * max_tokens)
    raise ValueError(f"unknown aggregation {aggregation!r}")


def truncated_importance_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """w_t = min(pi_old / pi_sampler, C) per token, without gradient."""
    return torch.exp(old_logprobs.detach() - sampler_logprobs.detach()).clamp(max=cap)


@torch.no_grad()
def importance_weight_stats(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, cap: float | None
) -> dict[str, float]:
    """Mean and max of pi_old / pi_sampler over unmasked tokens, and the fraction above `cap`."""
    weights = torch.exp(old_logprobs - sampler_logprobs)[mask.bool()]
    if weights.numel() == 0:
        return {"is_weight_mean": 1.0, "is_weight_max": 1.0, "is_capped_fraction": 0.0}
    capped = (weights > cap).float().mean().item() if cap is not None else 0.0
    return {"is_weight_mean": weights.mean().item(), "is_weight_max": weights.max().item(),
            "is_capped_fraction": capped}


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token_mean",
    max_tokens: int | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO objective with an optional KL penalty to a reference policy.

    logprobs (with grad), old_logprobs, ref_logprobs, sampler_logprobs and mask are [B, T];
    advantages is [B], one value per sequence broadcast over its tokens. With `tis_cap`, the
    policy term of each token is weighted by min(pi_old / pi_sampler, tis_cap). Returns the
    scalar loss and float statistics over the unmasked tokens.
    """
    old_logprobs = old_logprobs.detach()
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(1)  # A, the same for every token of o_i
    ratio = torch.exp(logprobs - old_logprobs)  # rho_t = pi_theta / pi_old
    clipped_ratio = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # clip(rho_t, 1-eps_low, 1+eps_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)  # -min(rho A, clip(rho) A)
    if tis_cap is not None:
        if sampler_logprobs is None:
            raise ValueError("tis_cap needs sampler_logprobs")
        per_token = truncated_importance_weights(old_logprobs, sampler_logprobs, tis_cap) * per_token  # w_t * ...
    kl = None
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta != 0 needs ref_logprobs")
        kl = kl_k3(logprobs, ref_logprobs.detach())
        per_token = per_token + beta * kl  # + beta * KL_k3
    loss = aggregate(per_token, mask, aggregation, max_tokens)
    return loss, _loss_stats(ratio, adv, mask, clip_low, clip_high, kl)


@torch.no_grad()
def _loss_stats(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    kl: torch.Tensor | None,
) -> dict[str, float]:
    """Clip fraction (tokens where the clip removed the gradient), KL and ratio range."""
    valid = mask.bool()
    ratios = ratio[valid]
    if ratios.numel() == 0:
        return {"clip_fraction": 0.0, "kl": 0.0, "ratio_min": 1.0, "ratio_mean": 1.0, "ratio_max": 1.0}
    advs = adv.expand_as(ratio)[valid]
    clipped = ((ratios > 1 + clip_high) & (advs > 0)) | ((ratios < 1 - clip_low) & (advs < 0))
    return {
        "clip_fraction": clipped.float().mean().item(),
        "kl": kl[valid].mean().item() if kl is not None else 0.0,
        "ratio_min": ratios.min().item(),
        "ratio_mean": ratios.mean().item(),
        "ratio_max": ratios.max().item(),
    }
