"""A hung actor is a dead actor, on a real local cluster: a wait that runs out of time names
the late call in its place (waits.fetch_each), and the Supervisor kills a frozen actor so that
Ray restarts it, counting the hang, while an actor that answers is left alone; Retry names a
worker that came back once, however many of its failures it saw."""

import os
import signal
import time

import pytest
import ray

from grpo_dist.controller.actors import LearnerWatch
from grpo_dist.controller.recovery import Supervisor
from grpo_dist.controller.retry import Call, Retry
from grpo_dist.common.waits import ActorLost, CallTimeout, fetch_each


@ray.remote(max_restarts=2, max_task_retries=0, num_cpus=0)
class Sleeper:
    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_a_late_call_gives_its_timeout_in_its_place_and_a_dead_one_its_error(ray_cluster):
    sleepers = [Sleeper.remote() for _ in range(3)]
    ray.get([s.pid.remote() for s in sleepers])
    refs = [sleepers[0].sleep.remote(0), sleepers[1].sleep.remote(60), sleepers[2].sleep.remote(60)]
    ray.kill(sleepers[2], no_restart=True)
    names = ["fast", "slow one", "killed"]
    with pytest.raises(CallTimeout, match=r"^slow one: not done after 2 s \(trainer.call_timeout_s\)$"):
        fetch_each(refs, names, 2.0)
    fast, slow, killed = fetch_each(refs, names, 2.0, late_ok=True)
    assert fast == 0
    assert isinstance(slow, CallTimeout) and str(slow) == "slow one: not done after 2 s (trainer.call_timeout_s)"
    assert isinstance(killed, ActorLost)
    for sleeper in sleepers:
        ray.kill(sleeper)


def test_the_supervisor_kills_the_frozen_actor_alone_and_ray_restarts_it(ray_cluster):
    """Two reward-role actors, one frozen (SIGSTOP): kill_unresponsive finds it by a no-op call,
    kills it, and waits until it is back; the other keeps its process. Counted as a hang and a restart."""
    learner = Sleeper.remote()  # stands in for the learner: the supervisor only asks whether it lives
    actors = [Sleeper.remote(), Sleeper.remote()]
    pids = ray.get([a.pid.remote() for a in actors])
    watch = LearnerWatch(learner, 30)
    supervisor = Supervisor({"reward": actors}, watch, max_restarts=2, start_timeout_s=60)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        assert supervisor.kill_unresponsive("evaluation: not done after 8 s", grace_s=3)
        new = ray.get([a.pid.remote() for a in actors], timeout=60)
    finally:
        try:
            os.kill(pids[1], signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert new[0] == pids[0] and new[1] != pids[1]
    assert supervisor.counters["reward/hangs"] == 1 and supervisor.counters["reward/restarts"] == 1
    assert not supervisor.kill_unresponsive("again", grace_s=3)  # everyone answers now: nobody is killed
    assert ray.get([a.pid.remote() for a in actors], timeout=60) == new
    for actor in [learner, *actors]:
        ray.kill(actor)


def test_a_worker_both_probed_as_hung_and_lost_by_a_call_needs_weights_once(ray_cluster):
    """One wait (`probe`): a late reward call, and a rollout call lost when its worker died; the
    worker's new process is frozen, so the probe kills it and the lost call gets it back again.
    It needs the current weights once (one repair), not once per way it was found."""
    learner = Sleeper.remote()  # stands in for the learner: the supervisor only asks whether it lives
    rollouts, rewards = [Sleeper.remote()], [Sleeper.remote()]
    ray.get([a.pid.remote() for a in [learner, *rollouts, *rewards]])
    supervisor = Supervisor({"rollout": rollouts, "reward": rewards}, LearnerWatch(learner, 30),
                            max_restarts=2, start_timeout_s=60)
    lost = rollouts[0].sleep.remote(60)
    ray.kill(rollouts[0], no_restart=False)  # the call fails with its process; Ray starts a new one
    ray.wait([lost], timeout=60)
    supervisor.wait_alive("rollout", 0)
    pid = ray.get(rollouts[0].pid.remote(), timeout=60)
    os.kill(pid, signal.SIGSTOP)
    try:
        calls = [Call(rewards[0].sleep.remote(60), "late scoring", ("reward", 0)),
                 Call(lost, "lost generation", ("rollout", 0))]
        waited = Retry(supervisor).wait(calls, 2.0, late="probe")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert waited.late == [0] and list(waited.again) == [1]
    assert waited.needs_weights == [0]
    assert supervisor.counters["rollout/hangs"] == 1 and supervisor.counters["rollout/restarts"] == 2
    for actor in [learner, *rollouts, *rewards]:
        ray.kill(actor)
