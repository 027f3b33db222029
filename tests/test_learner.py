"""The learner as a plain class: pi_old is the same whether it is reused or recomputed."""

import pytest

from grpo_dist.config import load_config
from grpo_dist.data import build_prompts
from grpo_dist.learner.worker import Learner
from grpo_dist.reward.rules import exact_answer
from grpo_dist.rollout.hf_engine import load_tokenizer
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.types import SamplingSettings


def scored_groups(config):
    worker = RolloutWorker(config.model, config.rollout, seed=0)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(58, 67), (12, 30), (99, 1), (45, 45)]]
    prompts = build_prompts(rows, config.data, load_tokenizer(config.model.path))
    groups = worker.generate(prompts, SamplingSettings(n=4, max_new_tokens=8), seeds=[0, 1, 2, 3])
    for group in groups:
        group.rewards = [exact_answer(group.prompt, c.text, group.row["answer"]) for c in group.completions]
    return groups


@pytest.mark.parametrize("overrides,passes", [([], 1), (["algo.mu=2", "algo.minibatch_size=8"], 4)])
def test_old_logprobs_are_the_sampling_policy_in_both_paths(overrides, passes):
    config = load_config(None, ["rollout.engine=transformers", "rollout.group_size=4", "rollout.threads=1",
                                "learner.threads=1", "algo.lr=1e-3", *overrides])
    learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
    metrics = learner.train_step(scored_groups(config))
    # pi_old (reused from the grad pass, or recomputed) equals the sampler's logprobs
    assert metrics["rollout/logprob_diff_max"] < 1e-4
    if passes == 1:  # the only step runs at pi_old itself: every ratio is exactly 1
        assert metrics["learner/ratio_min"] == metrics["learner/ratio_max"] == 1.0
    else:  # later minibatches and the second pass run on updated weights
        assert metrics["learner/ratio_max"] > 1.0 or metrics["learner/ratio_min"] < 1.0
    assert learner.version == 1
