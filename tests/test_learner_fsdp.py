"""Sharded learner ranks (learner.sharding=fsdp, torch FSDP2) on a real local Ray cluster, gloo on the CPU.

Every case compares K fsdp ranks with one unsharded rank (the reference the rest of the suite
trusts) on the same scored groups. Comparisons step with SGD, as test_learner_group's do:
AdamW's first step turns float noise in near-zero gradients into differences of up to lr.
"""

import sys

import pytest
import ray
import torch

from grpo_dist.config import ConfigError, load_config
from grpo_dist.learner.group import start_learner
from grpo_dist.learner.sharded import full
from grpo_dist.weights.checksum import state_checksum
from learner_helpers import make_config, make_learner, masters, scored_groups

COMMON = ["algo.beta=0.1", "rollout.temperature=0.7", "learner.micro_batch_size=3", "learner.num_cpus=0.5",
          "learner.sharding=fsdp"]
CASES = {
    "token_mean": ["algo.aggregation=token_mean"],
    "sequence_mean_two_passes_of_two_minibatches": ["algo.aggregation=sequence_mean", "algo.mu=2",
                                                    "algo.minibatch_size=8"],
    "constant_token_budget": ["algo.aggregation=constant", "learner.max_tokens_per_micro_batch=40"],
    "gspo_lora_two_minibatches": ["algo.ratio_level=sequence", "learner.lora.rank=4", "algo.minibatch_size=8"],
    "gradient_checkpointing": ["learner.gradient_checkpointing=true"],
}
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the helpers below run inside the ranks


def on_every_rank(group, function):
    """`function(learner)` run inside each rank's actor at once (collectives need all); the results."""
    return ray.get(group.__ray_call__.remote(lambda g: ray.get([r.__ray_call__.remote(function) for r in g.ranks])))


def use_sgd(learner):
    learner.optimizer = torch.optim.SGD(learner.weights.params, lr=0.1)
    learner.scheduler = torch.optim.lr_scheduler.LambdaLR(learner.optimizer, lambda step: 1.0)


def full_masters(learner):
    """The whole float32 masters (an all-gather per parameter) and this rank's shard sizes."""
    return [full(p.detach()).clone() for p in learner.weights.params], [p.to_local().numel() for p in
                                                                        learner.weights.params]


def full_served(learner):
    """The served state dict, gathered whole (a test's luxury: the learner never does this)."""
    return learner.weights.gather(list(learner.weights.served_names()))


@pytest.fixture(scope="module")
def groups():
    return scored_groups(make_config(*COMMON[:3]))


def unsharded(overrides):
    return [item for item in overrides if item != "learner.sharding=fsdp"]


def assert_one_rank_update(groups, overrides, ranks, atol=1e-5, **step):
    """K fsdp ranks' masters after one train_step equal one unsharded rank's within atol, and
    their metrics its metrics; every rank holds a shard (about 1/K of the parameters)."""
    single = make_learner(*unsharded(overrides), sgd=True)
    expected = single.train_step(groups, **step)
    group = start_learner(make_config(*overrides, f"learner.num_ranks={ranks}"))
    on_every_rank(group, use_sgd)
    metrics = ray.get(group.train_step.remote(groups, **step))
    per_rank = on_every_rank(group, full_masters)
    for got, want in zip(per_rank[0][0], masters(single)):
        torch.testing.assert_close(got, want, rtol=0, atol=atol)
    total = sum(p.numel() for p in masters(single))
    assert all(sum(sizes) <= total / ranks + 4096 for _, sizes in per_rank)  # sharded, not replicated
    for key in ("loss/total", "loss/kl", "policy/entropy", "policy/clip_fraction", "policy/ratio_max",
                "policy/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
    ray.get(group.close.remote())
    ray.kill(group)


@pytest.mark.parametrize("ranks,case", [(2, "token_mean"),
                                        *[pytest.param(3, case, marks=pytest.mark.slow) for case in CASES],
                                        pytest.param(2, "gspo_lora_two_minibatches", marks=pytest.mark.slow)])
def test_fsdp_ranks_give_the_one_rank_update(ray_cluster, groups, ranks, case):
    """Sharded masters, FSDP's float32 reduce-scatter (summed, the global D) and padded micro-batches
    give one rank's update for each aggregation, GSPO with LoRA, and gradient checkpointing."""
    assert_one_rank_update(groups, [*COMMON, *CASES[case]], ranks)


@pytest.mark.slow
def test_ranks_with_different_numbers_of_micro_batches(ray_cluster, groups):
    """One group of 4 rows over 3 ranks (2, 1, 1 rows; then 1, 1, 0 micro-batches of a token budget):
    the ranks with fewer run empty ones, which add nothing."""
    assert_one_rank_update(groups, [*COMMON, "learner.max_tokens_per_micro_batch=30"], 3, max_groups=1)


@pytest.mark.slow
def test_bfloat16_compute_is_close_to_one_rank(ray_cluster, groups):
    """bfloat16 compute from float32 sharded masters: FSDP casts the gathered masters exactly as
    precision.py rounds its compute copies, but reduces float32 gradients in another order than
    one rank's bfloat16 backward; after one SGD step the masters agree within 2e-3."""
    assert_one_rank_update(groups, [*COMMON, "model.dtype=bfloat16"], 2, atol=2e-3)


def test_weights_leave_bucket_by_bucket_with_the_served_checksum(ray_cluster, groups):
    """bfloat16: the object-store export is a list of buckets (each under the bucket size but a
    larger tensor) whose union is the served state dict; the group's checksum is its checksum
    and equals an unsharded learner's on the same weights (version 0: both loaded model.path)."""
    overrides = [*COMMON, "model.dtype=bfloat16", "learner.num_ranks=2"]
    group = start_learner(make_config(*overrides))
    assert ray.get(group.checksum.remote()) == make_learner(*unsharded(overrides)).checksum()
    ray.get(group.train_step.remote(groups))
    refs = ray.get(group.export_weights.remote(1 << 20))
    buckets = ray.get(refs)
    assert len(buckets) > 1
    served = {name: tensor for bucket in buckets for name, tensor in bucket.items()}
    assert {t.dtype for t in served.values() if t.is_floating_point()} >= {torch.bfloat16}
    assert ray.get(group.checksum.remote()) == state_checksum(served) == state_checksum(on_every_rank(group,
                                                                                                      full_served)[1])
    ray.get(group.close.remote())
    ray.kill(group)


def test_the_config_refuses_fsdp_without_ranks_and_offload_without_fsdp():
    """Before any actor starts (the launcher exits 2 on a ConfigError), naming the fields."""
    for overrides in (["learner.sharding=fsdp"], ["learner.offload=all"]):
        with pytest.raises(ConfigError, match=r"learner.sharding=fsdp needs learner.num_ranks >= 2"):
            load_config(None, overrides)
    assert load_config(None, ["learner.sharding=fsdp", "learner.num_ranks=2", "learner.offload=all"])
