"""Several learner ranks (learner.num_ranks) on a real local Ray cluster, gloo on the CPU.

Each rank is a real Learner actor in the group's placement group; the group is the actor the
controller talks to. Comparisons step with SGD (see test_learner.make_learner: AdamW's first
step turns float noise in near-zero gradients into differences of up to lr).
"""

import sys
import time

import pytest
import ray
import torch
from ray.util.placement_group import placement_group_table

from conftest import small_config
from grpo_dist.learner.group import start_learner
from grpo_dist.controller.loop import Trainer
from grpo_dist.weights.checksum import state_checksum
from test_learner import make_config, make_learner, masters, scored_groups

COMMON = ["algo.beta=0.1", "rollout.temperature=0.7", "learner.micro_batch_size=3", "learner.num_cpus=0.5"]
CASES = {
    "token_mean": ["algo.aggregation=token_mean"],
    "sequence_mean_two_passes_of_two_minibatches": ["algo.aggregation=sequence_mean", "algo.mu=2",
                                                    "algo.minibatch_size=8"],
    "constant_token_budget": ["algo.aggregation=constant", "learner.max_tokens_per_micro_batch=40"],
    "gspo_lora_two_minibatches": ["algo.ratio_level=sequence", "learner.lora.rank=4", "algo.minibatch_size=8"],
}
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the helpers below run inside the ranks


def on_every_rank(group, function):
    """`function(learner)` run inside each rank's actor; the results, rank by rank."""
    return ray.get(group.__ray_call__.remote(lambda g: ray.get([r.__ray_call__.remote(function) for r in g.ranks])))


def use_sgd(learner):
    learner.optimizer = torch.optim.SGD(learner.weights.params, lr=0.1)
    learner.scheduler = torch.optim.lr_scheduler.LambdaLR(learner.optimizer, lambda step: 1.0)


def rank_masters(learner):
    return [p.detach().clone() for p in learner.weights.params]


@pytest.fixture(scope="module")
def groups():
    return scored_groups(make_config(*COMMON))


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_give_the_one_rank_update(ray_cluster, groups, case):
    """The loss divisor is the whole minibatch's on every rank: two ranks' summed gradients
    are one rank's, for each aggregation (and GSPO with LoRA), with beta > 0, temperature 0.7,
    micro-batches, and pi_old/pi_ref computed in shares."""
    overrides = [*COMMON, *CASES[case]]
    single = make_learner(*overrides, sgd=True)
    expected = single.train_step(groups)
    group = start_learner(make_config(*overrides, "learner.num_ranks=2"))
    on_every_rank(group, use_sgd)
    metrics = ray.get(group.train_step.remote(groups[:1], groups[1:]))
    per_rank = on_every_rank(group, rank_masters)
    for got, want in zip(per_rank[0], masters(single)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(*per_rank))  # the ranks stay bit-identical
    for key in ("loss/total", "loss/policy", "loss/kl", "policy/entropy", "policy/clip_fraction",
                "policy/ratio_min", "policy/ratio_max", "policy/grad_norm", "rollout/logprob_diff_mean"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
    ray.get(group.close.remote())
    ray.kill(group)


def test_two_ranks_train_on_fewer_groups_like_one_rank(ray_cluster, groups):
    """Dynamic sampling hands the learner fewer groups than a full batch (max_groups): one group
    of 4 completions, 2 rows a rank, token_mean's divisor still the whole batch's."""
    overrides = [*COMMON, "algo.aggregation=token_mean"]
    single = make_learner(*overrides, sgd=True)
    expected = single.train_step(groups[:1])
    group = start_learner(make_config(*overrides, "learner.num_ranks=2"))
    on_every_rank(group, use_sgd)
    metrics = ray.get(group.train_step.remote(groups[:1], groups[1:], max_groups=1))
    for got, want in zip(on_every_rank(group, rank_masters)[0], masters(single)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert metrics["loss/total"] == pytest.approx(expected["loss/total"], rel=1e-4, abs=1e-6)
    assert metrics["policy/advantage_zero_fraction"] == expected["policy/advantage_zero_fraction"]
    ray.get(group.close.remote())
    ray.kill(group)


def test_a_group_serves_saves_and_loads_like_one_learner(ray_cluster, groups, tmp_path):
    """bfloat16 with float32 masters; the export is rank 0's served weights; save_state by rank
    0, load_state on every rank; close() gives the placement group back."""
    free = ray.available_resources()["CPU"]
    group = start_learner(make_config(*COMMON, "model.dtype=bfloat16", "learner.num_ranks=2"))
    ray.get(group.train_step.remote(groups))
    saved = ray.get(group.checksum.remote())
    assert state_checksum(ray.get(group.export_weights.remote())) == saved
    assert {t.dtype for t in ray.get(group.export_weights.remote()).values()} == {torch.bfloat16}
    ray.get(group.save_state.remote(str(tmp_path / "state")))
    metrics = ray.get(group.train_step.remote(groups))
    assert metrics["policy/version"] == 2.0 and ray.get(group.checksum.remote()) != saved
    ray.get(group.load_state.remote(str(tmp_path / "state")))
    assert ray.get(group.checksum.remote()) == saved  # every rank back (checksum compares them)
    ray.get(group.close.remote())
    ray.kill(group)
    assert all(v["state"] == "REMOVED" for v in placement_group_table().values()
               if v["bundles"] == {0: {"CPU": 0.5}, 1: {"CPU": 0.5}})
    deadline = time.monotonic() + 30  # Ray returns the resources asynchronously
    while ray.available_resources().get("CPU") != free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == free


@pytest.mark.slow
def test_the_trainer_runs_two_learner_ranks(ray_cluster, tmp_path):
    """The controller's own code path with num_ranks=2: weight sync and checksums through the group."""
    config = small_config(tmp_path, "rollout.num_workers=1", "rollout.engine=transformers", "learner.num_ranks=2",
                          "trainer.steps=2", "trainer.eval_every=0", "data.eval_rows=16", "trainer.save_final=true")
    summary = Trainer(config, tmp_path / "run").run()
    assert summary["steps"] == 2
    assert (tmp_path / "run" / "final" / "config.json").is_file()
