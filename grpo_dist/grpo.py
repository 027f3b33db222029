"""The GRPO algorithm: pure functions on tensors. No Ray, no I/O, no models.

Notation (one prompt q, a group of G completions o_1..o_G with rewards r_1..r_G):

    A_i   = (r_i - mean(r)) / (std(r) + eps)                 group-relative advantage
    rho_t = exp(log pi_theta(o_t) - log pi_old(o_t))         importance ratio per token
    L_t   = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A) + beta * KL_t
    KL_t  = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1   (k3, >= 0)

and the per-token losses L_t are averaged over the batch in one of three ways
(`aggregation`), which is where GRPO, DAPO and Dr. GRPO differ. Each is a sum over the
batch divided by a denominator D of the whole batch (`loss_denominator`); passing that D
explicitly makes the losses of micro-batches (or of data-parallel ranks) add up to the loss
of the whole batch, so accumulated gradients equal the whole batch's.

Every per-token input is zeroed where the mask is unset before anything is computed from
it: padding and prompt positions, whatever they hold, give log rho = 0 and KL = 0 there.

GSPO (`ratio_level="sequence"`) replaces the token ratio by one ratio per sequence, the
geometric mean of its token ratios, and clips that:

    s_i   = exp((1/|o_i|) sum_t log rho_it)                  sequence ratio, the same for each token of o_i
    L_it  = -min(s_i A, clip(s_i, 1 - eps_low, 1 + eps_high) A) + beta * KL_it

The sampler (vLLM) and the learner compute pi_old differently, so the tokens were drawn
from a slightly different pi_sampler. Truncated importance sampling (TIS) corrects that:

    w_t   = min(exp(log pi_old(o_t) - log pi_sampler(o_t)), C)   C = tis_cap
    L_t   = w_t * -min(rho_t A, clip(rho_t) A) + beta * KL_t

Every exp of a log-ratio above (rho_t, s_i, KL_t, w_t) takes the log-ratio clamped to
[-20, 20] first, as veRL's core_algos does (`ratio_from_log`): in float32 exp overflows to
inf above 88.7, and one such token would make the loss inf and skip the step. Inside the
bounds nothing changes; beyond them the value is e^(+-20) and the gradient through it 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

AdvantageScale = Literal["std", "none"]
Aggregation = Literal["token_mean", "sequence_mean", "constant"]
RatioLevel = Literal["token", "sequence"]

LOG_RATIO_BOUND = 20.0  # |log-ratio| before exp; e^20 = 4.9e8 is finite in float32 (inf above 88.7)


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: AdvantageScale = "std", eps: float = 1e-6
) -> torch.Tensor:
    """Advantages of N*G rewards, each run of `group_size` consecutive values one group.

    A group whose rewards are all equal gets exactly zero advantages (no NaN, no rounding
    residue): it carries no signal about which completion was better.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be 1-D with a multiple of {group_size} values, got {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # r_i - mean(r)
    # All r_i equal: A_i = 0 exactly. The float mean of equal values can miss them (eight 0.7s
    # in float32: by 6e-8), and that residue / (std + eps) is a spurious advantage of one sign.
    all_equal = ~informative_groups(rewards, group_size).unsqueeze(1)
    centered = centered.masked_fill(all_equal, 0.0)
    if scale == "none":  # Dr. GRPO: no division by the std
        return centered.flatten()
    if scale != "std":
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    std = grouped.std(dim=1, keepdim=True)  # Bessel-corrected sample std
    return (centered / (std + eps)).flatten()  # (r_i - mean(r)) / (std(r) + eps)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """One bool per group of `group_size` consecutive rewards: True unless all its rewards are
    equal. An uninformative group has zero advantages and carries no gradient; DAPO's dynamic
    sampling drops such groups and samples more."""
    grouped = rewards.view(-1, group_size)
    return ~(grouped == grouped[:, :1]).all(dim=1)


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """log_ratio clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND]: no gradient flows beyond the bounds."""
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def ratio_from_log(log_ratio: torch.Tensor) -> torch.Tensor:
    """p / q from log p - log q, finite whatever the log-ratio: exp(clamp(log_ratio, -20, 20))."""
    return torch.exp(clamp_log_ratio(log_ratio))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per token: unbiased and >= 0."""
    log_ratio = clamp_log_ratio(ref_logprobs - logprobs)  # log pi_ref - log pi_theta, in [-20, 20]
    return torch.exp(log_ratio) - log_ratio - 1  # exp(r) - r - 1


def loss_denominator(mask: torch.Tensor, aggregation: Aggregation, max_tokens: int | None = None) -> float:
    """D of a whole (mini)batch of B sequences, for `aggregate`:

        token_mean     D = sum_{i,t} m_it          the batch's completion tokens (at least 1)
        sequence_mean  D = B                       its number of sequences
        constant       D = B * max_tokens          Dr. GRPO's fixed divisor

    Data-parallel ranks sum their D (an all-reduce) to get the global one.
    """
    if aggregation == "token_mean":
        return max(float(mask.sum()), 1.0)
    if aggregation == "sequence_mean":
        return float(mask.shape[0])
    if aggregation == "constant":
        if max_tokens is None:
            raise ValueError("aggregation='constant' needs max_tokens")
        return float(mask.shape[0] * max_tokens)
    raise ValueError(f"unknown aggregation {aggregation!r}")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation,
    max_tokens: int | None = None,
    denominator: float | None = None,
) -> torch.Tensor:
    """Reduce [B, T] per-token values under `mask` to a scalar: a sum over these rows / D.

        token_mean     sum_{i,t} m_it L_it / D                  DAPO: every token weighs the same
        sequence_mean  sum_i (sum_t m_it L_it / |o_i|) / D      GRPO: every sequence weighs the same
        constant       sum_{i,t} m_it L_it / D                  Dr. GRPO: no length bias

    D is `denominator` when given (the whole batch's, so that the values of its parts add up
    to the whole's), else `loss_denominator` of these rows. Masked positions count as 0,
    whatever they hold.
    """
    valid = mask.bool()
    masked = torch.where(valid, per_token, torch.zeros_like(per_token))  # m_it L_it
    if aggregation == "sequence_mean":
        numerator = (masked.sum(dim=1) / valid.sum(dim=1).clamp(min=1)).sum()  # sum_i mean_t L_it
    elif aggregation in ("token_mean", "constant"):
        numerator = masked.sum()  # sum_{i,t} m_it L_it
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    if denominator is None:
        denominator = loss_denominator(mask, aggregation, max_tokens)
    return numerator / denominator


def truncated_importance_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """w_t = min(pi_old / pi_sampler, C) per token, without gradient."""
    return ratio_from_log(old_logprobs.detach() - sampler_logprobs.detach()).clamp(max=cap)


@torch.no_grad()
def importance_weight_stats(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, cap: float | None
) -> dict[str, float]:
    """Mean and max of pi_old / pi_sampler over unmasked tokens, and the fraction above `cap`."""
    weights = ratio_from_log(old_logprobs - sampler_logprobs)[mask.bool()]
    if weights.numel() == 0:
        return {"is_weight_mean": 1.0, "is_weight_max": 1.0, "is_capped_fraction": 0.0}
    capped = (weights > cap).float().mean().item() if cap is not None else 0.0
    return {"is_weight_mean": weights.mean().item(), "is_weight_max": weights.max().item(),
            "is_capped_fraction": capped}


@dataclass(frozen=True)
class LossInputs:
    """The per-token inputs of one (micro-)batch of B sequences padded to T tokens.

    logprobs          [B, T]  log pi_theta(o_t), with grad
    old_logprobs      [B, T]  log pi_old(o_t), the policy that the ratio is taken against
    advantages        [B]     A_i, one value per sequence broadcast over its tokens
    mask              [B, T]  1 on the completion tokens that count, 0 on prompt and padding
    ref_logprobs      [B, T]  log pi_ref(o_t), for the KL term (needed when beta != 0)
    sampler_logprobs  [B, T]  log pi_sampler(o_t) as the engine drew it (needed with tis_cap)
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    sampler_logprobs: torch.Tensor | None = None


@dataclass(frozen=True)
class LossSettings:
    """The objective's settings, the same for every micro-batch of a run.

    clip_low, clip_high  eps_low, eps_high of clip(rho, 1 - eps_low, 1 + eps_high)
    beta                 weight of the k3 KL penalty to pi_ref (0: no reference needed)
    aggregation          how the per-token losses reduce to one (see `aggregate`)
    max_tokens           the completion budget, D's factor for aggregation="constant"
    tis_cap              C of truncated importance sampling; None: no correction
    ratio_level          "token" (GRPO) or "sequence" (GSPO's s_i)
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    beta: float = 0.0
    aggregation: Aggregation = "token_mean"
    max_tokens: int | None = None
    tis_cap: float | None = None
    ratio_level: RatioLevel = "token"


def policy_loss_terms(
    inputs: LossInputs, settings: LossSettings, denominator: float | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped GRPO objective with an optional KL penalty to a reference policy; its
    statistics stay 0-dim tensors on the inputs' device (no host sync: the learner reads them
    once per optimizer step).

    With `tis_cap`, the policy term of each token is weighted by min(pi_old / pi_sampler,
    tis_cap). `denominator` is the whole batch's D when these rows are a micro-batch of it (see
    `aggregate`). `ratio_level="sequence"` is GSPO: every token of a sequence carries its
    sequence ratio s_i (a row is never split, so micro-batches change nothing). Returns the
    scalar loss and the statistics: `policy_loss` (the loss without the KL term, same D) and
    means over the unmasked tokens (of s_i's, for GSPO).
    """
    mask = inputs.mask
    valid = mask.bool()

    def only_valid(values: torch.Tensor) -> torch.Tensor:  # 0 where the mask is unset
        return torch.where(valid, values, torch.zeros_like(values))

    logprobs, old_logprobs = only_valid(inputs.logprobs), only_valid(inputs.old_logprobs.detach())
    adv = inputs.advantages.detach().to(logprobs.dtype).unsqueeze(1)  # A, the same for every token of o_i
    log_ratio = logprobs - old_logprobs  # log rho_t = log pi_theta - log pi_old (0 off the mask)
    if settings.ratio_level == "sequence":
        if settings.tis_cap is not None:
            raise ValueError("tis_cap weighs tokens: ratio_level='sequence' does not take it")
        lengths = valid.sum(dim=1, keepdim=True).clamp(min=1)  # |o_i|
        log_ratio = (log_ratio.sum(dim=1, keepdim=True) / lengths).expand_as(log_ratio)  # log s_i
    elif settings.ratio_level != "token":
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {settings.ratio_level!r}")
    ratio = ratio_from_log(log_ratio)  # rho_t = pi_theta / pi_old, or GSPO's s_i on every token of o_i
    clipped_ratio = torch.clamp(ratio, 1 - settings.clip_low, 1 + settings.clip_high)  # clip(rho, 1-eps_low, 1+eps_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)  # -min(rho A, clip(rho) A)
    if settings.tis_cap is not None:
        if inputs.sampler_logprobs is None:
            raise ValueError("tis_cap needs sampler_logprobs")
        weights = truncated_importance_weights(old_logprobs, only_valid(inputs.sampler_logprobs), settings.tis_cap)
        per_token = weights * per_token  # w_t * -min(rho A, clip(rho) A)
    policy_term = per_token
    kl = None
    if settings.beta != 0.0:
        if inputs.ref_logprobs is None:
            raise ValueError("beta != 0 needs ref_logprobs")
        kl = kl_k3(logprobs, only_valid(inputs.ref_logprobs.detach()))
        per_token = per_token + settings.beta * kl  # + beta * KL_k3
    loss = aggregate(per_token, mask, settings.aggregation, settings.max_tokens, denominator)
    stats = _loss_stats(ratio, adv, mask, settings.clip_low, settings.clip_high, kl)
    stats["policy_loss"] = aggregate(policy_term.detach(), mask, settings.aggregation, settings.max_tokens, denominator)
    return loss, stats


@torch.no_grad()
def _loss_stats(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    kl: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """Clip fraction (tokens where the clip removed the gradient), KL and ratio range, as 0-dim
    tensors computed with masks, never by selecting tokens (which reads their count on the host);
    with no token: 0, 0 and a ratio of 1."""
    valid = mask.bool()
    count = valid.sum()
    some = count > 0
    per_token = count.clamp(min=1).to(ratio.dtype)
    advs = adv.expand_as(ratio)
    clipped = valid & (((ratio > 1 + clip_high) & (advs > 0)) | ((ratio < 1 - clip_low) & (advs < 0)))
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    return {
        "clip_fraction": clipped.sum() / per_token,
        "kl": torch.where(valid, kl, 0.0).sum() / per_token if kl is not None else torch.zeros_like(one),
        "ratio_min": torch.where(some, torch.where(valid, ratio, torch.inf).min(), one),
        "ratio_mean": torch.where(some, torch.where(valid, ratio, 0.0).sum() / per_token, one),
        "ratio_max": torch.where(some, torch.where(valid, ratio, -torch.inf).max(), one),
    }
