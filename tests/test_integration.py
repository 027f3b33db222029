"""The whole system on a real local Ray cluster: real actors, real engines, real learner.

Every test runs once per rollout engine: transformers, and vLLM where it is installed
(CI installs the CPU build, so there both run), sampling at temperature 0.7.
"""

import pytest
import ray

from conftest import ENGINES, small_config
from grpo_dist.reward.rules import exact_answer
from grpo_dist.controller.run import TrainingRun
from grpo_dist.weights.errors import WeightSyncError
from grpo_dist.common.types import SamplingSettings

GROUP = 4


@pytest.fixture(scope="module", params=ENGINES)
def trainer(request, ray_cluster, tmp_path_factory):
    # temperature 0.7: the learner must score the sampled tokens at the sampler's temperature
    config = small_config(tmp_path_factory.mktemp("runs"), f"rollout.engine={request.param}",
                          "rollout.temperature=0.7")
    trainer = TrainingRun(config, run_dir=tmp_path_factory.mktemp("run"))
    trainer.start()  # the object-store weight sync: no GPUs here
    yield trainer
    trainer.stop()


def test_workers_run_the_configured_engine_in_one_placement_group(trainer):
    described = ray.get([w.describe.remote() for w in trainer.actors.rollouts])
    assert [d["engine"] for d in described] == [trainer.config.rollout.engine] * 2
    assert {d["placement_group"] for d in described} == {trainer.actors.placements["rollout"].id.hex()}


def test_workers_start_with_the_learners_weights(trainer):
    trainer.verify_weights()  # raises WeightSyncError otherwise


def test_groups_are_scored_by_the_reward_function(trainer):
    prompts = trainer.loop.cursor.next_batch(4)
    groups = trainer.loop.rollout(prompts, trainer.loop.sampling, step=1)
    assert len(groups) == 4 and [g.prompt_index for g in groups] == [p.index for p in prompts]
    for group in groups:
        assert len(group.completions) == GROUP and len(group.rewards) == GROUP
        for completion, reward in zip(group.completions, group.rewards):
            assert reward == exact_answer(group.prompt, completion.text, answer=group.row["answer"])
            assert len(completion.logprobs) == len(completion.token_ids) > 0
    assert any(r == 1.0 for g in groups for r in g.rewards), "the warm-started model should solve some"


def sample_fixed(trainer, prompts):
    """The same prompts with the same seeds: differences come from the weights alone."""
    return trainer.loop.rollout(prompts, SamplingSettings(n=GROUP, max_new_tokens=8), step=1234)


def test_steps_change_the_weights_and_every_worker_follows(trainer):
    learner = trainer.actors.learner
    before = ray.get(learner.checksum.remote())
    probe = trainer.loop.cursor.next_batch(4)
    sampled_before = sample_fixed(trainer, probe)
    metrics = [trainer.loop.step(step) for step in (1, 2)]
    after = ray.get(learner.checksum.remote())
    assert after != before
    sampled_after = sample_fixed(trainer, probe)
    logprobs = [[c.logprobs for c in g.completions] for g in (*sampled_before, *sampled_after)]
    assert logprobs[:4] != logprobs[4:], "the update must change what is sampled"
    assert [ray.get(w.checksum.remote()) for w in trainer.actors.rollouts] == [after, after]
    assert [ray.get(w.policy_version.remote()) for w in trainer.actors.rollouts] == [2, 2]
    for m in metrics:
        assert 0.0 <= m["reward/mean"] <= 1.0
        # a step moves the policy unless every group's rewards were equal (all advantages 0)
        assert m["policy/grad_norm"] > 0 or m["policy/advantage_zero_fraction"] == 1.0
        # in the synchronous loop the learner's old logprobs are the sampler's (same weights)
        assert m["rollout/logprob_diff_abs_max"] < 1e-3
        assert m["rollout/is_weight_max"] < 1.001 and m["rollout/is_capped_fraction"] == 0.0


def test_sampler_and_learner_logprobs_agree_after_the_update(trainer):
    prompts = trainer.loop.cursor.next_batch(8)
    groups = trainer.loop.rollout(prompts, trainer.loop.sampling, step=3)
    assert {g.policy_version for g in groups} == {trainer.loop.version}
    learner_logprobs = ray.get(trainer.actors.learner.logprobs.remote(groups))
    diffs = [
        abs(a - b)
        for group, group_lp in zip(groups, learner_logprobs)
        for completion, lp in zip(group.completions, group_lp)
        for a, b in zip(completion.logprobs, lp)
    ]
    assert len(diffs) > 8 * GROUP and max(diffs) < 1e-3


def test_a_worker_with_stale_weights_is_an_error(trainer):
    weights = ray.get(trainer.actors.learner.export_weights.remote())
    stale = {name: tensor + 0.01 if tensor.is_floating_point() else tensor for name, tensor in weights.items()}
    ray.get(trainer.actors.rollouts[1].load_weights.remote(stale, trainer.loop.version))
    with pytest.raises(WeightSyncError, match=r"\[1\]"):
        trainer.verify_weights()
    ray.get(trainer.actors.rollouts[1].load_weights.remote(weights, trainer.loop.version))
    trainer.verify_weights()
