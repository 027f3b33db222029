"""The algorithm against values computed by hand."""

import math

import pytest
import torch

from grpo_dist.grpo import (LOG_RATIO_BOUND, LossInputs, LossSettings, aggregate, group_advantages,
                            importance_weight_stats, informative_groups, kl_k3, loss_denominator, policy_loss_terms,
                            truncated_importance_weights)


def loss_and_floats(inputs: LossInputs, settings: LossSettings = LossSettings(),
                    denominator: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """policy_loss_terms with its statistics read as floats, as the learner reads them once per step."""
    loss, stats = policy_loss_terms(inputs, settings, denominator)
    return loss, {key: value.item() for key, value in stats.items()}


def test_advantages_std_scale_match_hand_values():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    # mean 0.25, Bessel std sqrt(0.75/3) = 0.5 -> (1-0.25)/0.5 = 1.5, (0-0.25)/0.5 = -0.5
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)


def test_advantages_are_computed_per_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 2.0, 4.0]), group_size=4)
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    # second group: mean 3, std sqrt(4/3)
    s = math.sqrt(4 / 3)
    assert torch.allclose(adv[4:], torch.tensor([-1 / s, 1 / s, -1 / s, 1 / s]), atol=1e-5)


def test_advantages_no_scale_is_centering_only():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, scale="none")
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_equal_rewards_give_zeros_not_nan():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), group_size=3)
    assert torch.equal(adv, torch.zeros(6))


@pytest.mark.parametrize("value", [0.7, 0.1, 1 / 3, -2.3e-4, 123.456])
@pytest.mark.parametrize("scale", ["std", "none"])
def test_equal_non_binary_rewards_give_exact_zeros(value, scale):
    # the float32 mean of eight 0.7s misses 0.7 by 6e-8: without care every A would be 0.056
    rewards = torch.cat([torch.full((8,), value, dtype=torch.float32), torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])])
    adv = group_advantages(rewards, group_size=8, scale=scale)
    assert torch.equal(adv[:8], torch.zeros(8))
    assert adv[8] > 0 and (adv[9:] < 0).all()  # the other group is untouched


@pytest.mark.parametrize("rewards,group_size", [(torch.ones(5), 2), (torch.ones(4), 1), (torch.ones(2, 2), 2)])
def test_advantages_reject_bad_shapes(rewards, group_size):
    with pytest.raises(ValueError):
        group_advantages(rewards, group_size)


MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
PER_TOKEN = torch.tensor([[1.0, 1.0, 9.0, 9.0], [4.0, 4.0, 4.0, 4.0]])  # 9s are masked out


@pytest.mark.parametrize(
    "aggregation,expected",
    [("token_mean", 3.0), ("sequence_mean", 2.5), ("constant", 2.25)],
)
def test_aggregations_match_hand_values(aggregation, expected):
    # token_mean: (1+1+4*4)/6 = 3; sequence_mean: (1+4)/2 = 2.5; constant: 18/(2*4) = 2.25
    assert aggregate(PER_TOKEN, MASK, aggregation, max_tokens=4).item() == pytest.approx(expected)


# Per-token values [[1,2,0],[3,4,5],[7,0,0]] under mask [[1,1,0],[1,1,1],[1,0,0]]:
# token_mean 22/6; sequence_mean (1.5 + 4 + 7)/3 = 12.5/3; constant (max_tokens 3) 22/9.
SPLIT_VALUES = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0], [7.0, 0.0, 0.0]])
SPLIT_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
SPLITS = [[[0, 1, 2]], [[0], [1], [2]], [[0, 1], [2]], [[1], [2, 0]], [[2], [0], [1]]]


@pytest.mark.parametrize("aggregation,expected", [("token_mean", 22 / 6), ("sequence_mean", 12.5 / 3),
                                                  ("constant", 22 / 9)])
@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_parts_with_the_whole_batch_denominator_add_up_to_the_whole(aggregation, expected, split):
    denominator = loss_denominator(SPLIT_MASK, aggregation, max_tokens=3)
    total = 0.0
    for rows in split:
        values, mask = SPLIT_VALUES[rows], SPLIT_MASK[rows]
        width = int(mask.sum(dim=1).max())  # a micro-batch cut to its longest row
        total += aggregate(values[:, :width], mask[:, :width], aggregation, max_tokens=3,
                           denominator=denominator).item()
    assert total == pytest.approx(expected, rel=1e-6)


def test_loss_denominators_match_hand_values():
    assert loss_denominator(SPLIT_MASK, "token_mean") == 6.0  # completion tokens
    assert loss_denominator(SPLIT_MASK, "sequence_mean") == 3.0  # sequences
    assert loss_denominator(SPLIT_MASK, "constant", max_tokens=3) == 9.0  # B * max_tokens
    assert loss_denominator(torch.zeros(2, 3), "token_mean") == 1.0  # never 0


def test_policy_loss_aggregates_per_token_losses():
    # ratio 1 everywhere and A = -per-token-loss makes -min(rho A, clip(rho) A) = -A = the values above
    zeros = torch.zeros(2, 4)
    advantages = torch.tensor([-1.0, -4.0])
    for aggregation, expected in [("token_mean", 3.0), ("sequence_mean", 2.5), ("constant", 2.25)]:
        loss, _ = loss_and_floats(LossInputs(zeros, zeros, advantages, MASK),
                                  LossSettings(aggregation=aggregation, max_tokens=4))
        assert loss.item() == pytest.approx(expected)


def test_k3_at_log_two():
    # ref - logp = ln 2: exp(ln 2) - ln 2 - 1 = 1 - ln 2 = 0.306853
    value = kl_k3(torch.tensor([0.0]), torch.tensor([math.log(2.0)]))
    assert value.item() == pytest.approx(0.306853, abs=1e-6)
    assert kl_k3(torch.tensor([-1.3]), torch.tensor([-1.3])).item() == 0.0


def test_kl_penalty_adds_beta_times_k3():
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(2.0))
    mask = torch.ones(1, 2)
    loss, stats = loss_and_floats(LossInputs(logp, logp, torch.tensor([0.0]), mask, ref_logprobs=ref),
                                  LossSettings(beta=0.1))
    assert loss.item() == pytest.approx(0.1 * 0.306853, abs=1e-6)
    assert stats["kl"] == pytest.approx(0.306853, abs=1e-6)


def test_gradient_through_a_clipped_token_is_zero():
    old = torch.zeros(1, 3)
    # token 0: ratio e^0.5 > 1.2 with A > 0 -> clipped; token 1: ratio 1.1 inside; token 2: ratio e^-0.5 < 0.8, A > 0 -> not clipped
    logp = torch.tensor([[0.5, math.log(1.1), -0.5]], requires_grad=True)
    loss, stats = loss_and_floats(LossInputs(logp, old, torch.tensor([1.0]), torch.ones(1, 3)))
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-1.1 / 3)  # d(-rho A)/dlogp = -rho A, / 3 tokens
    assert logp.grad[0, 2].item() == pytest.approx(-math.exp(-0.5) / 3)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)
    assert stats["ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-5)
    assert stats["ratio_min"] == pytest.approx(math.exp(-0.5), rel=1e-5)


def test_negative_advantage_clips_below():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[-0.5, 0.5]], requires_grad=True)  # ratios 0.61 (clipped for A<0), 1.65 (not)
    loss, stats = loss_and_floats(LossInputs(logp, old, torch.tensor([-1.0]), torch.ones(1, 2)),
                                  LossSettings(clip_low=0.2, clip_high=0.28))
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(math.exp(0.5) / 2, rel=1e-5)
    assert stats["clip_fraction"] == pytest.approx(0.5)


def test_masked_tokens_get_no_gradient():
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, _ = loss_and_floats(LossInputs(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.tensor([[1, 1, 0]])))
    loss.backward()
    assert logp.grad[0, 2].item() == 0.0


def test_beta_without_reference_is_an_error():
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_and_floats(LossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1)),
                        LossSettings(beta=0.1))


# Truncated importance sampling: pi_old = 0.5 on every token; the sampler gave the tokens
# probabilities 0.5, 0.25 and 0.05, so pi_old / pi_sampler = 1, 2, 10, capped at 3 -> 1, 2, 3.
TIS_OLD = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
TIS_SAMPLER = torch.log(torch.tensor([[0.5, 0.25, 0.05]]))
TIS_MASK = torch.ones(1, 3)


def test_truncated_importance_sampling_weighs_each_token_by_the_capped_ratio():
    logprobs = TIS_OLD.clone().requires_grad_(True)  # rho = 1: the policy term is -A = -1 per token
    loss, _ = loss_and_floats(LossInputs(logprobs, TIS_OLD, torch.tensor([1.0]), TIS_MASK,
                                         sampler_logprobs=TIS_SAMPLER), LossSettings(tis_cap=3.0))
    # token mean of -w_t * A = -(1 + 2 + 3) / 3 = -2 (without TIS it would be -1)
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    # d/dlogp of -w rho A / 3 at rho = 1 is -w / 3
    assert torch.allclose(logprobs.grad, torch.tensor([[-1 / 3, -2 / 3, -1.0]]))


def test_without_tis_cap_the_sampler_logprobs_are_ignored():
    loss, _ = loss_and_floats(LossInputs(TIS_OLD, TIS_OLD, torch.tensor([1.0]), TIS_MASK,
                                         sampler_logprobs=TIS_SAMPLER))
    assert loss.item() == pytest.approx(-1.0)


def test_tis_cap_without_sampler_logprobs_is_an_error():
    with pytest.raises(ValueError, match="sampler_logprobs"):
        loss_and_floats(LossInputs(TIS_OLD, TIS_OLD, torch.tensor([1.0]), TIS_MASK), LossSettings(tis_cap=2.0))


def test_importance_weight_stats_match_hand_values():
    stats = importance_weight_stats(TIS_OLD, TIS_SAMPLER, TIS_MASK, cap=3.0)
    # raw weights 1, 2, 10: mean 13/3, max 10, one of three above the cap
    assert stats["is_weight_mean"] == pytest.approx(13 / 3, rel=1e-5)
    assert stats["is_weight_max"] == pytest.approx(10.0, rel=1e-5)
    assert stats["is_capped_fraction"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("tis_cap", [None, 2.0])
def test_masked_positions_with_huge_gaps_give_finite_loss_and_gradient(tis_cap):
    """Prompt and padding positions hold what they hold (here gaps of 1e4 nats, -inf): with
    beta > 0 nothing there may overflow, and the result equals that of tame masked values."""
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    valid = mask.bool()
    tame = torch.tensor([[-1.0, -0.5, -2.0, -1.0], [-1.0, -1.0, -0.3, -1.2]])

    def at_masked(value: float) -> torch.Tensor:
        return torch.where(valid, tame, torch.full_like(tame, value))

    def run(logp_masked, old_masked, ref_masked, sampler_masked):
        logprobs = at_masked(logp_masked).requires_grad_(True)
        loss, stats = loss_and_floats(LossInputs(logprobs, at_masked(old_masked), torch.tensor([1.0, -0.5]), mask,
                                                 ref_logprobs=at_masked(ref_masked) + 0.1 * valid,
                                                 sampler_logprobs=at_masked(sampler_masked)),
                                      LossSettings(beta=0.04, tis_cap=tis_cap))
        loss.backward()
        return loss, stats, logprobs.grad

    loss, stats, grad = run(0.0, -1e4, 1e4, -math.inf)  # exp(1e4) overflows float32
    expected_loss, expected_stats, expected_grad = run(-1.0, -1.0, -1.0, -1.0)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-6)
    assert torch.equal(grad, expected_grad) and stats == expected_stats
    assert (grad[~valid] == 0).all()


def test_informative_groups_are_those_with_unequal_rewards():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.7, 0.7, 0.7])
    assert informative_groups(rewards, group_size=3).tolist() == [False, True, False]


# ---------------------------------------------------------------- clip-higher (DAPO)

@pytest.mark.parametrize("clip_high,expected_grad", [(0.2, 0.0), (0.28, -1.25)])
def test_clip_higher_lets_a_ratio_of_1_25_with_positive_advantage_through(clip_high, expected_grad):
    # rho = 1.25, A = 1: the symmetric clip (1.2) takes the gradient away; clip-higher (1.28) keeps it:
    # d(-rho A)/dlogp = -rho A = -1.25 (one token, D = 1)
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)
    loss, stats = loss_and_floats(LossInputs(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1)),
                                  LossSettings(clip_low=0.2, clip_high=clip_high))
    loss.backward()
    assert logp.grad.item() == pytest.approx(expected_grad)
    assert stats["clip_fraction"] == (1.0 if expected_grad == 0.0 else 0.0)


# ---------------------------------------------------------------- GSPO: ratio_level="sequence"

def test_sequence_ratio_is_the_geometric_mean_of_the_token_ratios():
    # token log-ratios [0.1, 0.3] (a third position masked, holding 5.0): s = exp((0.1 + 0.3) / 2) = exp(0.2)
    logp = torch.tensor([[0.1, 0.3, 5.0]])
    loss, stats = loss_and_floats(LossInputs(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.tensor([[1, 1, 0]])),
                                  LossSettings(clip_high=0.3, ratio_level="sequence", aggregation="sequence_mean"))
    assert stats["ratio_min"] == stats["ratio_max"] == pytest.approx(math.exp(0.2))
    assert loss.item() == pytest.approx(-math.exp(0.2))  # -s A, inside [0.8, 1.3]


# Two sequences: o_1 with log-ratios [0.1, 0.3] (s_1 = e^0.2 = 1.2214), A_1 = 1;
# o_2 with log-ratios [-0.1, 0.0, 0.1] (s_2 = 1), A_2 = -0.5.
GSPO_LOGP = torch.tensor([[0.1, 0.3, 0.0], [-0.1, 0.0, 0.1]])
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
GSPO_ADV = torch.tensor([1.0, -0.5])


@pytest.mark.parametrize("clip_high", [0.2, 0.28])
def test_sequence_ratio_gradient_matches_hand_and_autograd_values(clip_high):
    logp = GSPO_LOGP.clone().requires_grad_(True)
    loss, stats = loss_and_floats(LossInputs(logp, torch.zeros(2, 3), GSPO_ADV, GSPO_MASK),
                                  LossSettings(clip_low=0.2, clip_high=clip_high, aggregation="sequence_mean",
                                               ratio_level="sequence"))
    loss.backward()
    # sequence_mean over B = 2 of per-token values that are equal within a row:
    # L = (1/2) sum_i -min(s_i A_i, clip(s_i) A_i); unclipped, dL/dlogp_it = -(1/2) A_i s_i / |o_i|
    s1 = math.exp(0.2)
    row1 = 0.0 if clip_high == 0.2 else -0.5 * 1.0 * s1 / 2  # s_1 = 1.22 > 1.2: clipped, A > 0
    row2 = -0.5 * -0.5 * 1.0 / 3
    expected = torch.tensor([[row1, row1, 0.0], [row2, row2, row2]])
    torch.testing.assert_close(logp.grad, expected)
    clipped_s1 = min(s1, 1 + clip_high)
    assert loss.item() == pytest.approx(0.5 * (-clipped_s1 * 1.0 + 0.5 * 1.0))
    assert stats["clip_fraction"] == pytest.approx(2 / 5 if clip_high == 0.2 else 0.0)  # o_1's 2 tokens of 5

    # the same objective written directly, differentiated by autograd
    direct = GSPO_LOGP.clone().requires_grad_(True)
    lengths = GSPO_MASK.sum(dim=1)
    s = torch.exp((direct * GSPO_MASK).sum(dim=1) / lengths)
    objective = torch.min(s * GSPO_ADV, s.clamp(0.8, 1 + clip_high) * GSPO_ADV)
    (-objective.mean()).backward()
    torch.testing.assert_close(logp.grad, direct.grad)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_sequence_ratio_rows_split_with_the_whole_batch_denominator_add_up(aggregation):
    """Micro-batches split by rows: each sequence's s_i sees its whole row, and the parts' losses
    and gradients with the whole batch's D add up to the whole's."""
    old = torch.tensor([[0.05, -0.2, 0.0], [0.1, 0.1, -0.3]])
    kwargs = dict(aggregation=aggregation, max_tokens=3, ratio_level="sequence", clip_high=0.28)
    whole = GSPO_LOGP.clone().requires_grad_(True)
    loss, _ = loss_and_floats(LossInputs(whole, old, GSPO_ADV, GSPO_MASK), LossSettings(**kwargs))
    loss.backward()
    denominator = loss_denominator(GSPO_MASK, aggregation, max_tokens=3)
    parts = GSPO_LOGP.clone().requires_grad_(True)
    total = sum(loss_and_floats(LossInputs(parts[[row]], old[[row]], GSPO_ADV[[row]], GSPO_MASK[[row]]),
                                LossSettings(**kwargs), denominator=denominator)[0] for row in (0, 1))
    total.backward()
    assert total.item() == pytest.approx(loss.item(), rel=1e-6)
    torch.testing.assert_close(parts.grad, whole.grad)


def test_sequence_ratio_refuses_a_per_token_tis_cap():
    with pytest.raises(ValueError, match="sequence"):
        loss_and_floats(LossInputs(TIS_OLD, TIS_OLD, torch.tensor([1.0]), TIS_MASK, sampler_logprobs=TIS_SAMPLER),
                        LossSettings(tis_cap=2.0, ratio_level="sequence"))


# ---------------------------------------------------------------- the log-ratio clamp, [-20, 20]

E20 = math.exp(20.0)  # 4.85e8: the largest ratio; float32 overflows at exp(88.7)


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_a_log_ratio_inside_the_bounds_gives_the_unclamped_value_and_gradient(ratio_level):
    """One sequence, log-ratios [3, 1] (float64), A = -1: every ratio is above 1 + eps, so
    -min(rho A, clip(rho) A) = rho is not clipped and carries gradient.
    token: loss = (e^3 + e^1) / 2, d loss / d logp_t = rho_t / 2.
    sequence: s = exp((3 + 1) / 2) = e^2 on both tokens, loss = e^2, d loss / d logp_t = s / 2."""
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[3.0, 1.0]], dtype=torch.float64, requires_grad=True)
    loss, stats = loss_and_floats(LossInputs(logp, old, torch.tensor([-1.0]), torch.ones(1, 2)),
                                  LossSettings(ratio_level=ratio_level))
    loss.backward()
    if ratio_level == "token":
        assert loss.item() == pytest.approx((math.exp(3) + math.exp(1)) / 2, rel=1e-12)
        assert logp.grad[0].tolist() == pytest.approx([math.exp(3) / 2, math.exp(1) / 2], rel=1e-12)
        assert stats["ratio_max"] == pytest.approx(math.exp(3), rel=1e-12)
    else:
        assert loss.item() == pytest.approx(math.exp(2), rel=1e-12)
        assert logp.grad[0].tolist() == pytest.approx([math.exp(2) / 2] * 2, rel=1e-12)


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_a_log_ratio_beyond_the_bounds_gives_a_finite_loss_at_the_bound(ratio_level):
    """Log-ratios of 100 (float32: exp(100) = inf, which would skip the step) and -100 on a
    second sequence. A = -1 on the first: its per-token loss is the clamped ratio e^20 (no
    gradient through the clamp); A = +1 on the second: -min(rho, clip(rho)) = -e^-20.
    token_mean over 4 tokens: loss = (2 e^20 - 2 e^-20) / 4."""
    old = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    logp = torch.tensor([[100.0, 100.0], [-100.0, -100.0]], requires_grad=True)
    assert torch.isinf(torch.exp(logp - old)).any()  # what an unclamped ratio would be
    loss, stats = loss_and_floats(LossInputs(logp, old, torch.tensor([-1.0, 1.0]), torch.ones(2, 2)),
                                  LossSettings(ratio_level=ratio_level))
    loss.backward()
    assert LOG_RATIO_BOUND == 20.0
    assert torch.isfinite(loss) and loss.item() == pytest.approx((2 * E20 - 2 * math.exp(-20)) / 4, rel=1e-6)
    assert logp.grad.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert stats["ratio_max"] == pytest.approx(E20, rel=1e-6)
    assert stats["ratio_min"] == pytest.approx(math.exp(-20), rel=1e-6)


def test_k3_clamps_its_log_ratio_too():
    """ref - logp = 2 (inside): k3 = e^2 - 2 - 1 and d k3 / d logp = 1 - e^2, as unclamped.
    ref - logp = 100 (float32: exp = inf): k3 = e^20 - 20 - 1, finite, no gradient."""
    logp = torch.tensor([0.0, 0.0], dtype=torch.float64, requires_grad=True)
    value = kl_k3(logp, torch.tensor([2.0, 100.0], dtype=torch.float64))
    value.sum().backward()
    assert value.tolist() == pytest.approx([math.exp(2) - 3, E20 - 21], rel=1e-12)
    assert logp.grad.tolist() == pytest.approx([1 - math.exp(2), 0.0], rel=1e-12)
    far = kl_k3(torch.tensor([-100.0]), torch.tensor([0.0]))  # float32
    assert torch.isfinite(far) and far.item() == pytest.approx(E20 - 21, rel=1e-6)
    loss, stats = loss_and_floats(LossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([0.0]), torch.ones(1, 1),
                                             ref_logprobs=torch.tensor([[100.0]])), LossSettings(beta=0.5))
    assert loss.item() == pytest.approx(0.5 * (E20 - 21), rel=1e-6) and stats["kl"] == pytest.approx(E20 - 21, rel=1e-6)


def test_importance_weights_clamp_their_log_ratio_too():
    """pi_old / pi_sampler from a gap of 100 nats: capped by C anyway, and its statistic finite."""
    old, sampler = torch.tensor([[100.0, math.log(3.0)]]), torch.zeros(1, 2)
    assert truncated_importance_weights(old, sampler, cap=5.0)[0].tolist() == pytest.approx([5.0, 3.0])
    stats = importance_weight_stats(old, sampler, torch.ones(1, 2), cap=5.0)
    assert stats["is_weight_max"] == pytest.approx(E20, rel=1e-6)
    assert stats["is_weight_mean"] == pytest.approx((E20 + 3) / 2, rel=1e-6)


def test_statistics_stay_tensors_and_match_the_selected_tokens():
    """policy_loss_terms keeps its statistics as 0-dim tensors (no host read per micro-batch);
    they equal the same statistics computed over the selected unmasked tokens, and a row
    without tokens gives the defaults (no clip, ratio 1)."""
    torch.manual_seed(0)
    logp, old = torch.randn(3, 5) * 0.3, torch.randn(3, 5) * 0.3
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    adv, ref = torch.tensor([1.0, -1.0, 0.5]), torch.randn(3, 5) * 0.3
    _, stats = policy_loss_terms(LossInputs(logp, old, adv, mask, ref_logprobs=ref), LossSettings(beta=0.1))
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in stats.values())
    valid = mask.bool()
    ratios = torch.exp(logp - old)[valid]
    advs = adv.unsqueeze(1).expand(3, 5)[valid]
    clipped = ((ratios > 1.2) & (advs > 0)) | ((ratios < 0.8) & (advs < 0))
    assert stats["ratio_min"].item() == pytest.approx(ratios.min().item(), rel=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(ratios.max().item(), rel=1e-6)
    assert stats["ratio_mean"].item() == pytest.approx(ratios.mean().item(), rel=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(clipped.float().mean().item())
    assert stats["kl"].item() == pytest.approx(kl_k3(logp, ref)[valid].mean().item(), rel=1e-6)
    _, empty = loss_and_floats(LossInputs(logp, old, adv, torch.zeros(3, 5)))
    assert {k: empty[k] for k in ("clip_fraction", "kl", "ratio_min", "ratio_mean", "ratio_max")} == {
        "clip_fraction": 0.0, "kl": 0.0, "ratio_min": 1.0, "ratio_mean": 1.0, "ratio_max": 1.0}
