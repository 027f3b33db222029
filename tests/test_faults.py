"""The fault-injection helpers work on a real local cluster: kill -9 an actor, Ray restarts it."""

import os
import time

import pytest
import ray

from faults import actor_processes, kill_actor, wait_restarted


@ray.remote(max_restarts=1, num_cpus=0)
class Victim:
    def __init__(self) -> None:
        self.started = time.time()

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def test_kill_an_actor_by_title_and_wait_for_its_restart(ray_cluster):
    victims = [Victim.remote(), Victim.remote()]
    pids = sorted(ray.get([v.pid.remote() for v in victims]))
    assert sorted(p.pid for p in actor_processes("Victim")) == pids
    assert actor_processes("Vic") == []  # whole class names only
    busy = victims[0].sleep.remote(60)  # the kill lands in the middle of a call
    killed = kill_actor("Victim")
    assert killed == pids[0]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(busy, timeout=60)
    fresh = wait_restarted("Victim", killed, count=2)
    assert killed not in fresh and pids[1] in fresh
    assert sorted(ray.get([v.pid.remote() for v in victims], timeout=60)) == sorted(fresh)  # both answer again
    for victim in victims:
        ray.kill(victim)
