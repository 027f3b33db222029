"""The learning-rate schedule (learner/schedule.py) against hand values, and in a learner's metrics."""

import math

import pytest

from grpo_dist.learner.schedule import lr_factor
from learner_helpers import make_learner, scored_groups, make_config


@pytest.mark.parametrize("schedule,expected", [
    # N = 5 steps, W = 2 warmup steps: 1/2, 2/2, then p = (k - 2) / 3 for k = 2, 3, 4
    ("constant", [0.5, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.5, 1.0, 1.0, 2 / 3, 1 / 3]),
    ("cosine", [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 3)), 0.5 * (1 + math.cos(2 * math.pi / 3))]),
])
def test_factors_match_hand_values(schedule, expected):
    assert [lr_factor(k, schedule, 2, 5) for k in range(5)] == pytest.approx(expected)


def test_no_warmup_starts_at_the_full_rate_and_never_reaches_zero():
    assert lr_factor(0, "linear", 0, 4) == 1.0
    assert lr_factor(3, "linear", 0, 4) == 0.25
    assert lr_factor(3, "cosine", 0, 4) > 0


def test_the_learner_steps_the_schedule_once_per_grpo_step():
    """Two passes of two minibatches (four optimizer steps) per GRPO step: the rate moves per GRPO step."""
    overrides = ["algo.lr_schedule=linear", "algo.warmup_steps=1", "trainer.steps=3", "algo.mu=2",
                 "algo.minibatch_size=8"]
    learner = make_learner(*overrides)
    groups = scored_groups(make_config(*overrides))
    rates = [learner.train_step(groups)["policy/lr"] for _ in range(3)]
    assert rates == pytest.approx([1e-3, 1e-3, 1e-3 * 0.5])  # warmup 1/1; p = 0; p = 1/2
    assert learner.optimizer_steps == 12


def test_a_decaying_schedule_needs_the_run_length():
    from grpo_dist.learner.worker import Learner

    config = make_config("algo.lr_schedule=cosine")
    with pytest.raises(ValueError, match="trainer.steps"):
        Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
