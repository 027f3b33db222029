"""Multi-turn episodes through resume, actor restarts and async mode, end to end.

The built-in arithmetic_retry task (two turns, no chat template) over the small default run,
each a `python -m grpo_dist.launch` on its own local cluster. The reference is a calm sync run
of the same config: a sync run resumed after kill -9, and one whose rollout worker and reward
actor were killed mid-run, must play the same episodes turn by turn (the environment gets the
episode's seed, a chunk sent again plays the same episodes) and end at the same weights.
Async mode with a worker killed completes, with no episode staler than the bound.
"""

import json
from pathlib import Path

import pytest

from faults import kill_actor
from runs import ROOT, SMALL, finish, start, train_records
from test_recovery import faults_while_it_trains, run_dir_and_log
from test_resume import kill_9_after, max_weight_difference

pytestmark = pytest.mark.slow

TASK = ["--config", str(ROOT / "configs" / "default.yaml"), "--config", str(ROOT / "configs" / "arithmetic_retry.yaml")]
RUN = [*TASK, *SMALL, "trainer.steps=6", "trainer.checkpoint_every=3", "trainer.samples_every=1",
       "trainer.samples_per_log=8"]


def episodes(run_dir: Path) -> dict[int, list]:
    """Per step: (prompt index, sampling version, every completion's episode: replies, step
    rewards, stop reason, transcript), in the order the step had them."""
    steps: dict[int, list] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        played = [(e["replies"], e["step_rewards"], e["stop_reason"], e["transcript"])
                  for e in (c["episode"] for c in record["completions"])]
        steps.setdefault(record["step"], []).append((record["prompt_index"], record["policy_version"], played))
    return steps


def assert_same_training(run_dir: Path, calm: Path) -> None:
    records, expected = train_records(run_dir), train_records(calm)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # each once
    for name in ("data/position", "reward/mean", "env/turns_mean", "loss/total"):
        assert [r[name] for r in records] == [r[name] for r in expected], name
    assert episodes(run_dir) == episodes(calm)
    assert max_weight_difference(run_dir / "final", calm / "final") <= 1e-6


@pytest.fixture(scope="module")
def calm(tmp_path_factory) -> Path:
    """6 sync steps of arithmetic_retry episodes, nothing killed."""
    out = tmp_path_factory.mktemp("calm")
    code, output = finish(start(*RUN, f"trainer.output_dir={out}", "trainer.run_name=a"))
    assert code == 0, output[-3000:]
    records = train_records(out / "a")
    assert any(r["env/turns_mean"] > 1 for r in records), "no episode took a second turn: nothing multi-turn tested"
    return out / "a"


def test_sync_resume_after_kill_9_plays_the_same_episodes_and_ends_at_the_same_weights(calm, tmp_path):
    run_dir = tmp_path / "b"
    kill_9_after(3, run_dir, *RUN)
    code, output = finish(start("--resume", str(run_dir)))
    assert code == 0, output[-3000:]
    assert_same_training(run_dir, calm)
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] == 3


def test_killed_rollout_and_reward_actors_replay_their_episodes_exactly(calm, tmp_path):
    where, run_dir, log = run_dir_and_log(tmp_path)
    run = start(*RUN, *where, log=log)
    code, output = faults_while_it_trains(run, run_dir, log, lambda: kill_actor("RolloutWorker", root_pid=run.pid),
                                          lambda: kill_actor("RewardWorker", root_pid=run.pid))
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert sum(r.get("rollout/restarts", 0) for r in records) >= 1
    assert sum(r.get("reward/restarts", 0) for r in records) >= 1
    assert_same_training(run_dir, calm)


def test_async_episodes_with_a_killed_worker_complete_within_the_staleness_bound(tmp_path):
    where, run_dir, log = run_dir_and_log(tmp_path)
    run = start(*RUN, *where, "trainer.mode=async", "trainer.max_staleness=1", "rollout.num_workers=2",
                "learner.num_cpus=0.5", log=log)
    code, output = faults_while_it_trains(run, run_dir, log, lambda: kill_actor("RolloutWorker", root_pid=run.pid))
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert sum(r.get("rollout/restarts", 0) for r in records) >= 1
    assert max(r["rollout/staleness_max"] for r in records) <= 1
    for step, prompts in episodes(run_dir).items():
        for _, version, played in prompts:
            assert step - 1 - 1 <= version <= step - 1  # a whole episode sampled by one version within the bound
            assert all(len(replies) in (1, 2) for replies, *_ in played)
