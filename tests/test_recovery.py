"""Failures during a run, end to end: a `python -m grpo_dist.launch` subprocess on its own local
cluster, its actors killed or frozen from outside (tests/faults.py) as the issue describes.

- a rollout worker and a reward actor killed: Ray restarts them, the run catches them up and
  completes (exit 0), every step there, the restarts counted;
- the learner killed: exit 1, one message naming the step, the last checkpoint, the command;
- a rollout worker, then a reward actor frozen (SIGSTOP): each is killed past trainer.call_timeout_s,
  Ray restarts it, its chunk is sent again, and the run completes, the hangs counted;
- a rollout worker frozen where its only calls are weight loads: killed, restarted with the current
  weights, and the run completes;
- the learner frozen: exit 1 within trainer.call_timeout_s, naming its stage, with the resume command;
- async mode, a rollout worker killed, then one frozen: the run completes, no trained group staler
  than the bound;
- one of two learner ranks killed: exit 1 with the resume command, within seconds;
- every step's loss not finite: exit 1 after trainer.max_bad_steps steps, with a checkpoint;
- SIGINT: the step in progress finishes, a checkpoint, exit 130, the resume command printed.
"""

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from faults import actor_processes, busy_in, ended, freeze_actor, kill_actor, kill_session
from runs import ROOT, SMALL, finish, start, train_records, wait_for

pytestmark = pytest.mark.slow


def faults_while_it_trains(run, run_dir: Path, log: Path, *faults: Callable[[], int]) -> tuple[int, str]:
    """Once the run has trained two steps, each of `faults` kills (kill -9) or stops (SIGSTOP)
    one process and returns its pid; the next waits until that process is gone (the run kills
    a frozen actor: a hung actor is a dead one) and the run has trained another step. Then wait
    for the run to end: (exit code, output). Every frozen process is let go and the run's
    session killed whatever happens."""
    frozen: list[int] = []
    try:
        for freeze in faults:
            trained = len(train_records(run_dir))
            wait_for(lambda: len(train_records(run_dir)) >= max(2, trained + 1), run)
            frozen.append(freeze())
            wait_for(lambda: ended(frozen[-1]), run)
        return finish(run, log=log)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        kill_session(run.pid)


def run_dir_and_log(tmp_path: Path) -> tuple[list[str], Path, Path]:
    return [f"trainer.output_dir={tmp_path}", "trainer.run_name=run"], tmp_path / "run", tmp_path / "launch.log"


def summed(records: list[dict], name: str) -> float:
    return sum(record.get(name, 0.0) for record in records)


def test_killed_rollout_and_reward_actors_are_restarted_and_the_run_completes(tmp_path):
    where, run_dir, log = run_dir_and_log(tmp_path)
    steps = 40
    run = start(*SMALL, *where, f"trainer.steps={steps}", "rollout.num_workers=2", "learner.num_cpus=0.5",
                "reward.num_workers=1", "trainer.checkpoint_every=0", "trainer.samples_every=1",
                "trainer.samples_per_log=8", "trainer.save_final=false", log=log)
    code, output = faults_while_it_trains(run, run_dir, log, lambda: kill_actor("RolloutWorker", root_pid=run.pid),
                                          lambda: kill_actor("RewardWorker", root_pid=run.pid))
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert summed(records, "rollout/restarts") >= 1 and summed(records, "reward/restarts") >= 1, records[-1]
    assert summed(records, "rollout/retries") + summed(records, "reward/retries") >= 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollout_restarts"] >= 1 and summary["reward_restarts"] >= 1
    # sync mode: step t's groups were sampled by version t - 1, also the ones generated again
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["policy_version"] == record["step"] - 1, record["step"]


def test_a_dead_learner_ends_the_run_with_the_step_the_checkpoint_and_the_resume_command(tmp_path):
    where, run_dir, log = run_dir_and_log(tmp_path)
    run = start(*SMALL, *where, "trainer.steps=200", "trainer.checkpoint_every=2", log=log)
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "step_000002" / "COMPLETE").is_file(), run)
        kill_actor("Learner", root_pid=run.pid)
        code, output = finish(run, timeout=120, log=log)
    finally:
        kill_session(run.pid)
    assert code == 1, output[-3000:]
    found = re.search(r"error: the learner died (during \w+ )?at step (\d+) .*; the last checkpoint is (\S+) "
                      r"\(step (\d+)\); resume with: python -m grpo_dist.launch --resume (\S+)\n", output)
    assert found, output[-3000:]
    _, step, checkpoint, saved, resume_dir = found.groups()
    assert int(saved) >= 2 and int(step) > int(saved) and Path(resume_dir) == run_dir
    assert Path(checkpoint) == run_dir / "checkpoints" / f"step_{int(saved):06d}"
    assert (Path(checkpoint) / "COMPLETE").is_file()


def test_frozen_rollout_and_reward_actors_are_killed_restarted_and_the_run_completes(tmp_path):
    """A frozen engine (SIGSTOP while it generates), then a frozen reward actor: each call of theirs
    runs past trainer.call_timeout_s, the controller kills the actor, Ray restarts it, the chunk is
    sent again (sampled by the weights it should be), and the run completes."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    steps = 14
    run = start(*SMALL, *where, f"trainer.steps={steps}", "rollout.num_workers=2", "learner.num_cpus=0.5",
                "reward.num_workers=1", "trainer.call_timeout_s=8", "trainer.checkpoint_every=0",
                "trainer.samples_every=1", "trainer.samples_per_log=8", "trainer.save_final=false", log=log)
    code, output = faults_while_it_trains(run, run_dir, log,
                                          lambda: freeze_actor("RolloutWorker", root_pid=run.pid),
                                          lambda: freeze_actor("RewardWorker", root_pid=run.pid))
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert summed(records, "rollout/hangs") >= 1 and summed(records, "reward/hangs") >= 1, records
    assert summed(records, "rollout/restarts") >= 1 and summed(records, "reward/restarts") >= 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollout_hangs"] >= 1 and summary["reward_hangs"] >= 1
    for line in (run_dir / "samples.jsonl").read_text().splitlines():  # sync: sampled by version step - 1
        record = json.loads(line)
        assert record["policy_version"] == record["step"] - 1, record["step"]


def test_a_weight_load_that_never_ends_is_a_hung_worker_restarted_with_the_current_weights(tmp_path):
    """One prompt per step goes to rollout worker 0 (contiguous shares): worker 1 only takes
    weights, so with it frozen the first wait to run out is that for a weight load (the check
    of the served checksums, bounded by trainer.call_timeout_s): it is killed, restarted,
    given the current weights (verified), and the run completes."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    steps = 10
    run = start(*SMALL, *where, f"trainer.steps={steps}", "rollout.num_workers=2", "learner.num_cpus=0.5",
                "rollout.prompts_per_step=1", "data.eval=null", "trainer.call_timeout_s=8",
                "trainer.checkpoint_every=0", "trainer.save_final=false", log=log)

    def freeze_the_other_worker() -> int:  # (worker 1 has answered describe and checksum by now)
        generating = busy_in("RolloutWorker", "generate_chunk", root_pid=run.pid)
        [other] = [p.pid for p in actor_processes("RolloutWorker", run.pid) if p.pid != generating]
        os.kill(other, signal.SIGSTOP)
        return other

    code, output = faults_while_it_trains(run, run_dir, log, freeze_the_other_worker)
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert summed(records, "rollout/hangs") == 1 and summed(records, "rollout/restarts") == 1, records
    assert summed(records, "rollout/retries") == 0  # no chunk of worker 1's was lost: it had none


def test_a_frozen_learner_ends_the_run_naming_its_stage_with_the_resume_command(tmp_path):
    """Only the learner's hang ends the run: its state cannot be rebuilt by a restart."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    run = start(*SMALL, *where, "trainer.steps=1000", "trainer.call_timeout_s=8", "trainer.checkpoint_every=2",
                log=log)
    frozen = None
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "step_000002" / "COMPLETE").is_file(), run)
        frozen = freeze_actor("Learner", root_pid=run.pid)
        frozen_at = time.monotonic()
        code, output = finish(run, timeout=120, log=log)
        took = time.monotonic() - frozen_at
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGKILL)
        kill_session(run.pid)
    assert code == 1, output[-3000:]
    found = re.search(r"error: learner: (\w+): not done after 8 s \(trainer.call_timeout_s\); the last checkpoint is "
                      r"(\S+) \(step (\d+)\); resume with: python -m grpo_dist.launch --resume (\S+)\n", output)
    assert found, output[-3000:]
    assert (Path(found.group(2)) / "COMPLETE").is_file() and Path(found.group(4)) == run_dir
    assert took < 60, took


def test_async_a_killed_rollout_worker_and_a_frozen_one_are_restarted_and_no_group_is_staler_than_the_bound(
        tmp_path):
    """Async mode, two batches in flight: a rollout worker killed, then one frozen (killed by the
    run past trainer.call_timeout_s); chunks sent again are sampled by the current weights, and no
    trained group lags the learner by more than max_staleness."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    steps, bound = 30, 1
    run = start(*SMALL, *where, f"trainer.steps={steps}", "trainer.mode=async", f"trainer.max_staleness={bound}",
                "rollout.num_workers=2", "learner.num_cpus=0.5", "trainer.checkpoint_every=0",
                "trainer.call_timeout_s=8", "trainer.samples_every=1", "trainer.samples_per_log=8",
                "trainer.save_final=false", log=log)
    code, output = faults_while_it_trains(run, run_dir, log, lambda: kill_actor("RolloutWorker", root_pid=run.pid),
                                          lambda: freeze_actor("RolloutWorker", root_pid=run.pid))
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert summed(records, "rollout/restarts") >= 2 and summed(records, "rollout/hangs") >= 1, records[-1]
    assert json.loads((run_dir / "summary.json").read_text())["rollout_restarts"] >= 2
    assert max(r["rollout/staleness_max"] for r in records) == bound
    # each group: the version that sampled it, against the learner's that trained on it
    trained_by = {r["step"]: int(r["policy/version"]) - 1 for r in records}
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == list(range(1, steps + 1)) and len(samples) == 8 * steps
    lags = [trained_by[s["step"]] - s["policy_version"] for s in samples]
    assert 0 <= min(lags) and max(lags) == bound, lags


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_a_dead_learner_rank_ends_the_run_within_seconds_with_the_resume_command(tmp_path, sharding):
    """learner.num_ranks=2, one rank killed (preferably in train_step): Ray tells the group's wait
    at once (it fails fast on the first rank it loses), long before trainer.call_timeout_s (600 s
    here, the default) or learner.collective_timeout_s, where its peer may be stuck. With fsdp the
    checkpoint before it is the sharded one (each rank's shards, sealed by COMPLETE)."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    run = start(*SMALL, *where, "trainer.steps=1000", "learner.num_ranks=2", "learner.num_cpus=0.5",
                f"learner.sharding={sharding}", "rollout.num_workers=1", "trainer.checkpoint_every=2", log=log)
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "step_000002" / "COMPLETE").is_file(), run)
        kill_actor("Learner", root_pid=run.pid)
        killed_at = time.monotonic()
        code, output = finish(run, timeout=120, log=log)
        took = time.monotonic() - killed_at
    finally:
        kill_session(run.pid)
    assert code == 1, output[-3000:]
    found = re.search(r"error: the learner died (during \w+ )?at step (\d+) .*; the last checkpoint is (\S+) "
                      r"\(step (\d+)\); resume with: python -m grpo_dist.launch --resume (\S+)\n", output)
    assert found, output[-3000:]
    _, step, checkpoint, saved, resume_dir = found.groups()
    assert int(saved) >= 2 and int(step) > int(saved) and Path(resume_dir) == run_dir
    assert (Path(checkpoint) / "COMPLETE").is_file()
    assert (Path(checkpoint) / "shards").is_dir() == (sharding == "fsdp")
    assert took < 45, took


def test_steps_whose_loss_is_never_finite_stop_the_run_with_a_checkpoint(tmp_path):
    """Rewards of up to 4e37 are finite in float32 (larger ones score as failures), but their
    advantages, unscaled, overflow the loss: every step's loss or gradient is not finite, each is
    skipped, and after trainer.max_bad_steps of them the run stops."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    reward = ("reward.functions=[{name: exact_answer}, "
              "{name: 'reward_helpers:signed_length', kwargs: {scale: 1.0e+37}}]")
    run = start(*SMALL, *where, reward, "algo.advantage_scale=none", "trainer.steps=20", "trainer.max_bad_steps=2",
                log=log)
    code, output = finish(run, log=log)
    assert code == 1, output[-3000:]
    assert "error: steps 1-2 had a loss or gradient that is not finite (trainer.max_bad_steps=2 in a row" in output
    records = train_records(run_dir)
    assert [r["step"] for r in records] == [1, 2] and all(r["policy/step_skipped"] == 1 for r in records)
    assert (run_dir / "checkpoints" / "step_000002" / "COMPLETE").is_file()
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["policy_version"] == 2 and state["counters"]["bad_steps_in_a_row"] == 2


@pytest.mark.parametrize("broken", ["reward", "env"])
def test_steps_where_every_sample_failed_stop_the_run_with_the_first_error(tmp_path, broken):
    """A reward function that raises on every sample, or an environment whose every reset raises:
    each step trains on nothing, and after trainer.max_bad_steps of them the run stops (exit 1,
    the first error, a checkpoint, the resume command) instead of training on nothing to the end."""
    where, run_dir, log = run_dir_and_log(tmp_path)
    setting = {"reward": ["reward.functions=[{name: exact_answer}, {name: 'reward_helpers:always_raises'}]"],
               "env": ["--config", str(ROOT / "configs" / "default.yaml"), "--config",
                       str(ROOT / "configs" / "arithmetic_retry.yaml"), "env.name=env_helpers:BrokenReset"]}[broken]
    run = start(*setting, *SMALL, *where, "trainer.steps=20", "trainer.max_bad_steps=2", log=log)
    code, output = finish(run, log=log)
    first = {"reward": "reward function reward_helpers:always_raises failed on every sample (32), the first: "
                       "exception: RuntimeError: the reward broke",
             "env": "every episode failed (32), the first: reset: RuntimeError: reset broke"}[broken]
    assert code == 1, output[-3000:]
    assert f"error: steps 1-2 trained on nothing (trainer.max_bad_steps=2 in a row): {first}; the last checkpoint " \
           f"is {run_dir / 'checkpoints' / 'step_000002'} (step 2); resume with: python -m grpo_dist.launch " \
           f"--resume {run_dir}\n" in output, output[-3000:]
    assert [r["step"] for r in train_records(run_dir)] == [1, 2]
    assert (run_dir / "checkpoints" / "step_000002" / "COMPLETE").is_file()


def test_sigint_finishes_the_step_saves_and_exits_130(tmp_path):
    where, run_dir, log = run_dir_and_log(tmp_path)
    run = start(*SMALL, *where, "trainer.steps=1000", "trainer.checkpoint_every=0", log=log)
    try:
        wait_for(lambda: len(train_records(run_dir)) >= 2, run)
        run.send_signal(signal.SIGINT)  # the driver alone, as Ctrl-C in a terminal would (it reaches the group)
        code, output = finish(run, timeout=120, log=log)
    finally:
        kill_session(run.pid)
    assert code == 130, output[-3000:]
    step = train_records(run_dir)[-1]["step"]
    assert [r["step"] for r in train_records(run_dir)] == list(range(1, step + 1))
    checkpoint = run_dir / "checkpoints" / f"step_{step:06d}"
    assert f"stopped by SIGINT after step {step}; the last checkpoint is {checkpoint} (step {step}); resume with: " \
           f"python -m grpo_dist.launch --resume {run_dir}" in output, output[-3000:]
    assert (checkpoint / "COMPLETE").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "SIGINT"
