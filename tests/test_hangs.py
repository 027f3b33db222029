"""A hung actor is a dead actor, on a real local cluster: a wait that runs out of time names
the late call in its place (waits.fetch_each), and the Supervisor kills a frozen actor so that
Ray restarts it, counting the hang, while an actor that answers is left alone."""

import os
import signal
import time

import pytest
import ray

from grpo_dist.controller.actors import LearnerWatch
from grpo_dist.controller.recovery import Supervisor
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
