"""Dynamic sampling (DAPO, grpo_dist/controller/dynamic.py): a step trains on prompts_per_step informative
groups, found in at most algo.dynamic_sampling_max_rounds rounds.

The pieces by hand (round sizes, the predicate the reward actor filters with, the learner's
max_groups), then short runs on a real local Ray cluster with the transformers engine. The runs
train on the default task's rows with the answer of most rows replaced by one no completion
gives: on those prompts the reward is a constant 0, so their groups carry nothing.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import small_config
from grpo_dist import grpo
from grpo_dist.config.schema import resolve_path
from grpo_dist.controller.dynamic import round_size
from grpo_dist.reward.chunk_stats import informative
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.controller.run import TrainingRun
from grpo_dist.common.types import Completion, Group
from learner_helpers import make_config, make_learner, masters, scored_groups

GROUP, PROMPTS = 4, 8  # small_config's group_size and prompts_per_step
ROWS = Path(resolve_path("builtin:arithmetic/train.jsonl"))


@pytest.mark.parametrize("missing,kept,generated,expected", [
    (3, 6, 8, 4),  # 6 of 8 were informative: 3 more take ceil(3 * 8 / 6) = 4 prompts
    (2, 3, 13, 8),  # ceil(2 * 13 / 3) = 9, but a round holds at most prompts_per_step
    (5, 0, 8, 8),  # nothing informative yet: a whole round
    (1, 8, 9, 2),  # ceil(9 / 8)
])
def test_a_round_asks_for_what_is_missing_at_the_share_seen_so_far(missing, kept, generated, expected):
    assert round_size(missing, kept, generated, most=PROMPTS) == expected


def group(rewards: list[float], texts: list[str] | None = None, answer: str = "5") -> Group:
    texts = texts or ["x"] * len(rewards)
    completions = [Completion([1], [0.0], text, "stop") for text in texts]
    return Group(0, {"prompt": "2+3=", "answer": answer}, "2+3=", [1, 2], completions, 0, rewards=rewards)


def test_informative_is_what_the_learner_sees_as_informative():
    """Rewards equal in float32 but not in float64 (0.7 and 0.7 + 1e-9): uninformative for both."""
    rewards = [[1.0, 0.0, 1.0, 1.0], [0.7] * 4, [0.7, 0.7, 0.7, 0.7 + 1e-9], [0.5, 0.25, 0.5, 0.5]]
    assert len(set(rewards[2])) == 2, "distinct as Python floats"
    kept = informative([group(r) for r in rewards])
    assert kept == [True, False, False, True]
    advantages = grpo.group_advantages(torch.tensor(sum(rewards, []), dtype=torch.float32), GROUP).view(-1, GROUP)
    assert [bool(a.ne(0).any()) for a in advantages] == kept


def test_the_reward_actor_passes_on_only_the_informative_groups_and_counts_them():
    """The sums cover every group scored (reward/ metrics describe what was generated)."""
    worker = RewardWorker(make_config().reward)
    try:
        right, wrong = "<answer>5</answer>", "<answer>4</answer>"
        groups = [group([], [right, wrong, right, right]), group([], [wrong] * 4), group([], [right] * 4)]
        kept, stats = worker.score_chunk(groups, informative_only=True)
        assert [g.rewards for g in kept] == [[1.0, 0.0, 1.0, 1.0]]
        assert (stats["groups"], stats["informative"], stats["completions"], stats["reward_sum"]) == (3, 1, 12, 7)
        every, plain = worker.score_chunk(groups)
        assert len(every) == 3 and "informative" not in plain
    finally:
        worker.close()


def test_the_learner_trains_on_the_first_max_groups():
    groups = scored_groups(make_config())
    first = make_learner(sgd=True)
    expected = first.train_step(groups[:2])
    limited = make_learner(sgd=True)
    metrics = limited.train_step(groups[:1], groups[1:], max_groups=2)
    assert all(torch.equal(a, b) for a, b in zip(masters(first), masters(limited)))
    assert {k: v for k, v in metrics.items() if not k.startswith(("time/", "system/"))} == \
        {k: v for k, v in expected.items() if not k.startswith(("time/", "system/"))}


def rows_with_answers(path: Path, every: int) -> Path:
    """The default task's training rows; only every `every`-th keeps its answer (0: none does)."""
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    path.write_text("".join(json.dumps({**row, "answer": row["answer"] if every and i % every == 0 else "none"}) + "\n"
                            for i, row in enumerate(rows)))
    return path


def run(tmp_path: Path, every: int, *overrides: str) -> tuple[TrainingRun, list[dict]]:
    config = small_config(tmp_path, "rollout.engine=transformers", "trainer.steps=3", "trainer.eval_every=0",
                          "data.eval=null", f"data.train={rows_with_answers(tmp_path / 'train.jsonl', every)}",
                          "algo.dynamic_sampling=true", *overrides)
    trainer = TrainingRun(config, tmp_path / "run")
    trainer.run()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return trainer, [r for r in records if r["kind"] == "train"]


def check_steps(trainer: TrainingRun, records: list[dict], max_rounds: int, max_staleness: int) -> None:
    """What every step's metrics must say, whatever the rewards were."""
    version = 0
    for r in records:
        trained, rounds, extra = r["rollout/dynamic_groups"], r["rollout/dynamic_rounds"], \
            r["rollout/dynamic_extra_completions"]
        generated = PROMPTS + extra / GROUP
        informative_groups = trained + r["rollout/dynamic_surplus_groups"]
        assert 1 <= rounds <= max_rounds and (extra == 0) == (rounds == 1) and extra % GROUP == 0
        assert r["rollout/dynamic_dropped_fraction"] == pytest.approx(1 - informative_groups / generated)
        assert r["rollout/dynamic_bound_reached"] == float(trained < PROMPTS)
        if trained < PROMPTS:  # fell short: the bound was reached, and no surplus
            assert rounds == max_rounds and r["rollout/dynamic_surplus_groups"] == 0
        if trained:  # every trained group is informative
            version += 1
            assert r["policy/advantage_zero_fraction"] == 0.0
        assert r["policy/version"] == version and r["rollout/staleness_max"] <= max_staleness
    # the cursor gave out exactly the prompts generated: none replayed, none skipped
    drawn = sum(PROMPTS + r["rollout/dynamic_extra_completions"] / GROUP for r in records)
    assert trainer.loop.cursor.position == drawn


@pytest.mark.slow
def test_sync_the_bound_holds_when_most_rewards_are_constant(ray_cluster, tmp_path):
    """1 prompt in 4 can be informative: 3 rounds a step do not find 8 such groups; the step
    trains on the groups it found."""
    trainer, records = run(tmp_path, 4, "algo.dynamic_sampling_max_rounds=3")
    check_steps(trainer, records, max_rounds=3, max_staleness=0)
    assert all(r["rollout/dynamic_bound_reached"] == 1.0 and 0 < r["rollout/dynamic_groups"] < PROMPTS
               for r in records)


@pytest.mark.slow
def test_async_extra_rounds_fill_the_batch_within_the_staleness_bound(ray_cluster, tmp_path):
    """Every answer kept: a second round, sized to what is missing, fills the batch; the learner
    takes the first 8 informative groups. Round 1 of steps 2 and 3 was sampled a version behind."""
    trainer, records = run(tmp_path, 1, "algo.dynamic_sampling_max_rounds=3", "trainer.mode=async",
                           "trainer.max_staleness=1")
    check_steps(trainer, records, max_rounds=3, max_staleness=1)
    assert [r["rollout/staleness_max"] for r in records] == [0.0, 1.0, 1.0]
    assert all(r["rollout/dynamic_groups"] == PROMPTS for r in records)
    assert any(r["rollout/dynamic_rounds"] > 1 for r in records)
    assert any(0 < r["rollout/dynamic_extra_completions"] < PROMPTS * GROUP for r in records), "a smaller round"


@pytest.mark.slow
def test_with_nothing_informative_no_step_updates_the_policy(ray_cluster, tmp_path):
    """A constant reward everywhere: every step runs its 2 rounds and skips the learner; the
    version stays 0, no weights are pushed, the final policy is the initial one."""
    trainer, records = run(tmp_path, 0, "algo.dynamic_sampling_max_rounds=2", "trainer.save_final=true")
    check_steps(trainer, records, max_rounds=2, max_staleness=0)
    assert [r["rollout/dynamic_groups"] for r in records] == [0.0] * 3
    assert not any(key.startswith("loss/") for r in records for key in r)
    final = load_file(tmp_path / "run" / "final" / "model.safetensors")
    initial = load_file(Path(resolve_path("builtin:arithmetic/model")) / "model.safetensors")
    assert final.keys() == initial.keys() and all(torch.equal(final[k], initial[k]) for k in final)
