"""Sharded learner ranks (learner.sharding=fsdp, torch FSDP2) on a real local Ray cluster, gloo on the CPU.

Every case compares K fsdp ranks with one unsharded rank (the reference the rest of the suite
trusts) on the same scored groups. Comparisons step with SGD, as test_learner_group's do:
AdamW's first step turns float noise in near-zero gradients into differences of up to lr.
"""

import sys

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from conftest import small_config
from grpo_dist.config.schema import ConfigError, load_config
from grpo_dist.controller.run import TrainingRun
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.distributed import DataParallel
from grpo_dist.learner.sharded import full
from grpo_dist.weights.checksum import state_checksum
from grpo_dist.weights.nccl import NcclSync
from learner_helpers import (PROBLEMS, learner_group, make_config, make_learner, masters, metric_tolerance,
                             scored_groups)

COMMON = ["algo.beta=0.1", "rollout.temperature=0.7", "learner.micro_batch_size=3", "learner.num_cpus=0.5",
          "learner.sharding=fsdp"]
CASES = {
    "token_mean": ["algo.aggregation=token_mean"],
    "sequence_mean_two_passes_of_two_minibatches": ["algo.aggregation=sequence_mean", "algo.mu=2",
                                                    "algo.minibatch_size=8"],
    "constant_token_budget": ["algo.aggregation=constant", "learner.max_tokens_per_micro_batch=40"],
    "gspo_lora_two_minibatches": ["algo.ratio_level=sequence", "learner.lora.rank=4", "algo.minibatch_size=8"],
    "gradient_checkpointing": ["learner.gradient_checkpointing=true"],
    "cpu_offload": ["learner.offload=all"],  # FSDP2's CPUOffloadPolicy; on the CPU the same arithmetic
}
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the helpers below run inside the ranks


def on_every_rank(group, function):
    """`function(learner)` run inside each rank's actor at once (collectives need all); the results."""
    return ray.get(group.__ray_call__.remote(lambda g: ray.get([r.__ray_call__.remote(function) for r in g.target.ranks])))


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
    """The same config for one unsharded learner."""
    return [item for item in overrides if not item.startswith(("learner.sharding=", "learner.offload="))]


def assert_one_rank_update(groups, overrides, ranks, atol=1e-5, logprob_atol=1e-5, bucket_bytes=1 << 20, **step):
    """K fsdp ranks' masters after one train_step equal one unsharded rank's within atol, and
    their metrics its metrics; every rank holds a shard (about 1/K of the parameters); before
    the step both give the same logprobs and serve the same weights (model.path's), checksum
    for checksum."""
    single = make_learner(*unsharded(overrides), sgd=True)
    with learner_group(overrides, ranks) as group:
        got = ray.get(group.logprobs.remote(groups[:1]))  # a no-grad pass on every rank, then a checksum
        for got_rows, want_rows in zip(got[0], single.logprobs(groups[:1])[0]):
            assert got_rows == pytest.approx(want_rows, abs=logprob_atol)
        assert ray.get(group.checksum.remote()) == single.checksum()
        expected = single.train_step(groups, **step)
        on_every_rank(group, use_sgd)
        metrics = ray.get(group.train_step.remote(groups, **step))
        per_rank = on_every_rank(group, full_masters)
        for got, want in zip(per_rank[0][0], masters(single)):
            torch.testing.assert_close(got, want, rtol=0, atol=atol)
        total = sum(p.numel() for p in masters(single))
        assert all(sum(sizes) <= total / ranks + 4096 for _, sizes in per_rank)  # sharded, not replicated
        for key in ("loss/total", "loss/kl", "policy/entropy", "policy/clip_fraction", "policy/ratio_max",
                    "policy/grad_norm"):
            assert metrics[key] == pytest.approx(expected[key], rel=metric_tolerance(key), abs=1e-6), key
        served = assert_published_bucket_by_bucket(group, bucket_bytes)
        want = single.export_weights()  # LoRA: merged; the same names, dtypes and values within a rounding
        assert served.keys() == want.keys()
        for name, tensor in served.items():
            assert tensor.dtype == want[name].dtype, name
            close = 1e-2 if tensor.dtype == torch.bfloat16 else atol  # masters 1e-5 apart may round apart
            torch.testing.assert_close(tensor.float(), want[name].float(), rtol=0, atol=close)


def assert_published_bucket_by_bucket(group, bucket_bytes=1 << 20):
    """The object-store export is a list of buckets (each at most bucket_bytes but for a larger
    tensor alone) whose union is the served state dict, and the group's checksum is its checksum;
    returns that state dict."""
    buckets = ray.get(ray.get(group.export_weights.remote(bucket_bytes)))
    assert len(buckets) > 1
    assert all(sum(t.numel() * t.element_size() for t in b.values()) <= bucket_bytes or len(b) == 1 for b in buckets)
    served = {name: tensor for bucket in buckets for name, tensor in bucket.items()}
    assert ray.get(group.checksum.remote()) == state_checksum(served)
    assert state_checksum(served) == state_checksum(on_every_rank(group, full_served)[1])
    return served


@pytest.mark.parametrize("ranks,case", [(2, "token_mean"),
                                        *[pytest.param(3, case, marks=pytest.mark.slow) for case in CASES],
                                        pytest.param(2, "gspo_lora_two_minibatches", marks=pytest.mark.slow)])
def test_fsdp_ranks_give_the_one_rank_update(ray_cluster, groups, ranks, case):
    """Sharded masters, FSDP's float32 reduce-scatter (summed, the global D) and padded micro-batches
    give one rank's update for each aggregation, GSPO with LoRA, and gradient checkpointing."""
    assert_one_rank_update(groups, [*COMMON, *CASES[case]], ranks)


@pytest.mark.slow
def test_two_fsdp_ranks_give_the_one_rank_update_on_the_real_model(ray_cluster, real_model):
    """SmolLM2-135M-Instruct (134.5M parameters, tied embeddings, GQA) in float32: the same checks
    as above, on 2 prompts x 4 completions of up to 8 tokens. Its 30 layers add up more rounding
    between the ranks' batch shapes and one rank's than the tiny model's: logprobs 2.5e-5 apart
    before the step (measured)."""
    overrides = [*COMMON, f"model.path={real_model}", "rollout.max_new_tokens=8"]
    groups = scored_groups(make_config(*unsharded(overrides)), problems=PROBLEMS[:2])
    for group in groups:  # every reply runs to 8 tokens here, so the token bonus is flat: score by characters
        group.rewards = [0.01 * len(completion.text) for completion in group.completions]
    assert any(len(set(group.rewards)) > 1 for group in groups)  # a step that moves the weights
    assert_one_rank_update(groups, overrides, 2, logprob_atol=1e-4, bucket_bytes=64 << 20)


@pytest.mark.slow
def test_ranks_with_different_numbers_of_micro_batches(ray_cluster, groups):
    """One group of 4 rows over 3 ranks, one row per micro-batch: the ranks run 2, 1 and 1
    micro-batches (checked here with the learner's own split), so two ranks pad with an empty
    one, which adds nothing."""
    batch = TrainBatch.from_groups(groups[:1], pad_id=0)
    rows = torch.arange(len(batch))
    counts = [len(batch.micro_batches(DataParallel(rank, 3).shard(rows, batch.lengths), 1, None)) for rank in range(3)]
    assert counts == [2, 1, 1]
    assert_one_rank_update(groups, [*COMMON, "learner.micro_batch_size=1"], 3, max_groups=1)


@pytest.mark.slow
def test_bfloat16_compute_is_close_to_one_rank(ray_cluster, groups):
    """bfloat16 compute from float32 sharded masters: FSDP casts the gathered masters exactly as
    precision.py rounds its compute copies, but reduces float32 gradients in another order than
    one rank's bfloat16 backward; after one SGD step the masters agree within 1e-4 (measured: 6e-6)."""
    assert_one_rank_update(groups, [*COMMON, "model.dtype=bfloat16"], 2, atol=1e-4)


@pytest.mark.slow
def test_a_bfloat16_group_exports_bfloat16_and_saves_and_resumes_sharded(ray_cluster, groups, tmp_path):
    """bfloat16 weights leave as bfloat16; save_state writes each rank's shards (DCP) and a
    consolidated policy that from_pretrained loads with the group's float32 masters. A fresh
    group of 2 ranks loads it and takes the next step bit for bit; a group of 3 loads it
    (resharded) and takes it within 1e-4 (AdamW turns reduction-order noise into up to lr)."""
    overrides = [*COMMON, "model.dtype=bfloat16"]
    with learner_group(overrides, 2) as group:
        ray.get(group.train_step.remote(groups))
        buckets = ray.get(ray.get(group.export_weights.remote()))
        assert {t.dtype for b in buckets for t in b.values() if t.is_floating_point()} == {torch.bfloat16}
        ray.get(group.save_state.remote(str(tmp_path / "state")))
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / "state" / "policy", dtype=torch.float32)
        for got, want in zip(saved.parameters(), on_every_rank(group, full_masters)[0][0]):
            assert torch.equal(got, want)
        expected = ray.get(group.train_step.remote(groups))
        after = on_every_rank(group, full_masters)[0][0]
    for ranks, atol in ((2, 0.0), (3, 1e-4)):
        with learner_group(overrides, ranks) as group:
            assert ray.get(group.load_state.remote(str(tmp_path / "state"))) == 1
            metrics = ray.get(group.train_step.remote(groups))
            assert metrics["policy/version"] == 2.0
            assert metrics["loss/total"] == pytest.approx(expected["loss/total"], rel=1e-4, abs=1e-6)
            for got, want in zip(on_every_rank(group, full_masters)[0][0], after):
                torch.testing.assert_close(got, want, rtol=0, atol=atol)


def test_the_config_refuses_fsdp_without_ranks_and_offload_without_fsdp():
    """Before any actor starts (the launcher exits 2 on a ConfigError), naming the fields."""
    for overrides in (["learner.sharding=fsdp"], ["learner.offload=all"]):
        with pytest.raises(ConfigError, match=r"learner.sharding=fsdp needs learner.num_ranks >= 2"):
            load_config(None, overrides)
    assert load_config(None, ["learner.sharding=fsdp", "learner.num_ranks=2", "learner.offload=all"])


@pytest.mark.slow
def test_the_default_task_learns_with_two_fsdp_ranks(ray_cluster, tmp_path):
    """The controller's path with sharded ranks: each version published bucket by bucket through
    the object store, its served checksum verified; the consolidated final/ loads. Learns like
    one rank (docs/learner.md: 0.323 -> 0.920 at step 20 with the transformers engine, float32)."""
    config = small_config(tmp_path, "rollout.num_workers=1", "rollout.engine=transformers", "rollout.prompts_per_step=32",
                          "rollout.group_size=8", "algo.lr=1e-4", "learner.num_ranks=2", "learner.sharding=fsdp",
                          "trainer.steps=20", "trainer.eval_every=0", "data.eval_rows=300", "trainer.save_final=true")
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["steps"] == 20
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.3, summary
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final").config.num_hidden_layers > 0


@pytest.mark.slow
def test_fsdp_ranks_broadcast_bucket_by_bucket_over_the_weight_group(ray_cluster, tmp_path):
    """NcclSync (gloo, the CPU stand-in) from 2 fsdp ranks: every rank gathers each bucket of the
    plan, rank 0 broadcasts it; the engine serves the group's checksum after every step."""
    config = small_config(tmp_path, "rollout.engine=transformers", "rollout.num_workers=1", "learner.num_ranks=2",
                          "learner.sharding=fsdp")
    trainer = TrainingRun(config, run_dir=tmp_path / "run")
    trainer.start(lambda _, learner, rollouts: NcclSync(learner, rollouts, timeout_s=120, bucket_bytes=256 << 10,
                                                        backend="gloo"))
    try:
        assert len(trainer.transport.plan) > 1
        trainer.verify_weights()
        learner = trainer.actors.learner
        before = ray.get(learner.checksum.remote())
        for step in (1, 2):
            trainer.loop.step(step)  # ends with sync.push and the checksum check
        after = ray.get(learner.checksum.remote())
        assert after != before and [ray.get(w.checksum.remote()) for w in trainer.actors.rollouts] == [after]
    finally:
        trainer.stop()
