"""Several learner ranks (learner.num_ranks) on a real local Ray cluster, gloo on the CPU.

Each rank is a real Learner actor in the group's placement group; the group is the actor the
controller talks to. Comparisons step with SGD (see test_learner.make_learner: AdamW's first
step turns float noise in near-zero gradients into differences of up to lr).
"""

import os
import sys
import time

import pytest
import ray
import torch
from ray.util.placement_group import placement_group_table

from conftest import small_config
from grpo_dist.controller.run import TrainingRun
from grpo_dist.learner.group import PEER_DEATH_GRACE_S, ROUTES, LearnerGroup, offer_learner_methods, unrouted
from grpo_dist.learner.worker import Learner
from grpo_dist.common.waits import CallTimeout
from grpo_dist.weights.checksum import state_checksum
from learner_helpers import learner_group, make_config, make_learner, masters, metric_tolerance, scored_groups

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
    return ray.get(group.__ray_call__.remote(lambda g: ray.get([r.__ray_call__.remote(function) for r in g.target.ranks])))


def use_sgd(learner):
    learner.optimizer = torch.optim.SGD(learner.weights.params, lr=0.1)
    learner.scheduler = torch.optim.lr_scheduler.LambdaLR(learner.optimizer, lambda step: 1.0)


def rank_masters(learner):
    return [p.detach().clone() for p in learner.weights.params]


def test_every_public_learner_method_is_offered_by_the_group():
    """A Learner method that ROUTES does not name (nor the group define) fails the import."""
    assert unrouted(Learner, LearnerGroup) == []

    class Grown(Learner):
        def new_method(self) -> None: ...

    assert unrouted(Grown, LearnerGroup) == ["new_method"]
    with pytest.raises(TypeError, match=r"\['checksum', 'train_step'\]"):
        offer_learner_methods(type("Bare", (), {}))  # routes everything but what the group combines


@ray.remote(num_cpus=0)
class FakeRank:
    """Answers like a Learner rank, with its own values; records what it was asked; `slow` methods hang."""

    def __init__(self, index: int, slow: tuple[str, ...] = ()) -> None:
        self.index, self.slow, self.calls = index, slow, []

    def _answer(self, method: str, value):
        self.calls.append(method)
        if method in self.slow:
            time.sleep(60)
        return value

    def save(self, path):
        return self._answer("save", f"rank {self.index} saved {path}")

    def load_state(self, directory):
        return self._answer("load_state", self.index)

    def checksum(self):
        return self._answer("checksum", "same" if self.index < 2 else "other")

    def train_step(self, groups):
        return self._answer("train_step", {"loss/total": float(self.index + len(groups)),
                                           "system/learner_peak_memory_mb": [300.0, 500.0, 400.0][self.index]})

    def seen(self):
        return self.calls


def fake_group(*slow: tuple[str, ...], timeout_s: float = 30.0) -> LearnerGroup:
    """A group over one FakeRank per argument, each hanging in the methods named there."""
    group = LearnerGroup.__new__(LearnerGroup)  # no placement group, no real ranks
    group.ranks = [FakeRank.remote(index, rank_slow) for index, rank_slow in enumerate(slow)]
    group.timeout_s = timeout_s
    group.routes = ROUTES
    return group


def test_the_group_routes_combines_and_bounds_each_call(ray_cluster):
    """save on rank 0 alone, load_state on every rank (rank 0's answer); train_step gives rank
    0's metrics with the largest peak memory; checksum refuses ranks that disagree; a late rank
    ends the wait at timeout_s with a CallTimeout that names it and the method."""
    group = fake_group((), (), ())
    assert group.save("out") == "rank 0 saved out"  # rank 0 alone
    assert group.load_state("state") == 0  # every rank; rank 0's answer
    assert group.train_step([1, 2], [3], max_groups=2) == {"loss/total": 2.0, "system/learner_peak_memory_mb": 500.0}
    with pytest.raises(RuntimeError, match="learner ranks hold different weights"):
        group.checksum()
    assert ray.get([rank.seen.remote() for rank in group.ranks]) == [
        ["save", "load_state", "train_step", "checksum"], *[["load_state", "train_step", "checksum"]] * 2]
    for rank in group.ranks:
        ray.kill(rank)
    group = fake_group(("save",), (), ("load_state",), timeout_s=3.0)
    ray.get([rank.seen.remote() for rank in group.ranks])  # started: the bound is on the calls alone
    with pytest.raises(CallTimeout, match=r"^learner rank 2: load_state: not done after 3 s \(trainer.call_timeout_s\)$"):
        group.load_state("state")
    with pytest.raises(CallTimeout, match=r"learner rank 0: save: not done after 3 s"):
        group.save("out")
    for rank in group.ranks:
        ray.kill(rank)


@ray.remote(num_cpus=0, max_restarts=0)
class EndingRank:
    """A rank whose train_step, after `delay_s`, raises (a collective's error) or ends its process."""

    def __init__(self, how: str, delay_s: float) -> None:
        self.how, self.delay_s = how, delay_s

    def train_step(self, groups):
        time.sleep(self.delay_s)
        if self.how == "exit":
            os._exit(1)
        if self.how == "raise":
            raise RuntimeError("gloo: Read error: Connection reset by peer")
        time.sleep(60)


def ending_group(*ends: tuple[str, float]) -> LearnerGroup:
    group = LearnerGroup.__new__(LearnerGroup)
    group.ranks, group.timeout_s, group.routes = [EndingRank.remote(*end) for end in ends], 30.0, ROUTES
    ray.get([rank.__ray_ready__.remote() for rank in group.ranks])
    return group


def test_a_rank_whose_peer_died_reports_the_death_not_its_echo(ray_cluster):
    """Rank 0's collective fails the moment its peer's process ends, before Ray knows the peer is
    dead (the CI's fsdp run saw "Connection reset by peer" named as the cause): the group waits
    briefly for the death and raises it. An exception with no dead peer raises as it is, once the
    grace has passed even if a peer hangs."""
    group = ending_group(("raise", 0.2), ("exit", 1.0))
    with pytest.raises(ray.exceptions.RayActorError):
        group.train_step([1])
    group = ending_group(("raise", 0.2), ("hang", 0.0))
    started = time.monotonic()
    with pytest.raises(ray.exceptions.RayTaskError, match="Connection reset by peer"):
        group.train_step([1])
    assert time.monotonic() - started < PEER_DEATH_GRACE_S + 5
    for rank in group.ranks:
        ray.kill(rank)


@pytest.fixture(scope="module")
def groups():
    return scored_groups(make_config(*COMMON))


# token_mean in the ray tier; the other aggregations (about 10-14 s each) in the slow tier
@pytest.mark.parametrize("case", [case if case == "token_mean" else pytest.param(case, marks=pytest.mark.slow)
                                  for case in CASES])
def test_two_ranks_give_the_one_rank_update(ray_cluster, groups, case):
    """The loss divisor is the whole minibatch's on every rank: two ranks' summed gradients
    are one rank's, for each aggregation (and GSPO with LoRA), with beta > 0, temperature 0.7,
    micro-batches, and pi_old/pi_ref computed in shares."""
    overrides = [*COMMON, *CASES[case]]
    single = make_learner(*overrides, sgd=True)
    expected = single.train_step(groups)
    with learner_group(overrides, 2) as group:
        on_every_rank(group, use_sgd)
        metrics = ray.get(group.train_step.remote(groups[:1], groups[1:]))
        per_rank = on_every_rank(group, rank_masters)
    for got, want in zip(per_rank[0], masters(single)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(*per_rank))  # the ranks stay bit-identical
    for key in ("loss/total", "loss/policy", "loss/kl", "policy/entropy", "policy/clip_fraction",
                "policy/ratio_min", "policy/ratio_max", "policy/grad_norm", "rollout/logprob_diff_abs_mean"):
        assert metrics[key] == pytest.approx(expected[key], rel=metric_tolerance(key), abs=1e-6), key


def test_two_ranks_train_on_fewer_groups_like_one_rank(ray_cluster, groups):
    """Dynamic sampling hands the learner fewer groups than a full batch (max_groups): one group
    of 4 completions, 2 rows a rank, token_mean's divisor still the whole batch's."""
    overrides = [*COMMON, "algo.aggregation=token_mean"]
    single = make_learner(*overrides, sgd=True)
    expected = single.train_step(groups[:1])
    with learner_group(overrides, 2) as group:
        on_every_rank(group, use_sgd)
        metrics = ray.get(group.train_step.remote(groups[:1], groups[1:], max_groups=1))
        rank_zero = on_every_rank(group, rank_masters)[0]
    for got, want in zip(rank_zero, masters(single)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert metrics["loss/total"] == pytest.approx(expected["loss/total"], rel=1e-4, abs=1e-6)
    assert metrics["policy/advantage_zero_fraction"] == expected["policy/advantage_zero_fraction"]


def test_a_group_serves_saves_and_loads_like_one_learner(ray_cluster, groups, tmp_path):
    """bfloat16 with float32 masters; the export is rank 0's served weights; save_state by rank
    0, load_state on every rank; close() gives the placement group back."""
    free = ray.available_resources()["CPU"]
    with learner_group([*COMMON, "model.dtype=bfloat16"], 2) as group:  # closed and killed at the end
        ray.get(group.train_step.remote(groups))
        saved = ray.get(group.checksum.remote())
        assert state_checksum(ray.get(group.export_weights.remote())) == saved
        assert {t.dtype for t in ray.get(group.export_weights.remote()).values()} == {torch.bfloat16}
        ray.get(group.save_state.remote(str(tmp_path / "state")))
        metrics = ray.get(group.train_step.remote(groups))
        assert metrics["policy/version"] == 2.0 and ray.get(group.checksum.remote()) != saved
        ray.get(group.load_state.remote(str(tmp_path / "state")))
        assert ray.get(group.checksum.remote()) == saved  # every rank back (checksum compares them)
    assert all(v["state"] == "REMOVED" for v in placement_group_table().values()
               if v["bundles"] == {0: {"CPU": 0.5}, 1: {"CPU": 0.5}})
    # Ray returns resources asynchronously, the group's and an earlier test's actors' alike: at
    # least what was free before the group started comes back
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) >= free


@pytest.mark.slow
def test_the_trainer_runs_two_learner_ranks(ray_cluster, tmp_path):
    """The controller's own code path with num_ranks=2: weight sync and checksums through the group."""
    config = small_config(tmp_path, "rollout.num_workers=1", "rollout.engine=transformers", "learner.num_ranks=2",
                          "trainer.steps=2", "trainer.eval_every=0", "data.eval_rows=16", "trainer.save_final=true")
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["steps"] == 2
    assert (tmp_path / "run" / "final" / "config.json").is_file()
