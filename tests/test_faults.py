"""The fault-injection helpers work on a real local cluster: kill -9 an actor, Ray restarts it."""

import os
import signal
import time

import pytest
import ray

from faults import actor_processes, freeze_actor, kill_actor, title, wait_restarted


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
    busy_pid = ray.get(victims[1].pid.remote())
    busy = victims[1].sleep.remote(60)
    deadline = time.monotonic() + 60
    while not any(title(p) == "ray::Victim.sleep" for p in actor_processes("Victim")):  # busy: titled by method
        assert time.monotonic() < deadline
        time.sleep(0.1)
    killed = kill_actor("Victim")  # the busy one: the kill lands in the middle of a call
    assert killed == busy_pid
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(busy, timeout=60)
    fresh = wait_restarted("Victim", killed, count=2)
    assert killed not in fresh and (set(pids) - {killed}) < set(fresh)
    assert sorted(ray.get([v.pid.remote() for v in victims], timeout=60)) == sorted(fresh)  # both answer again
    for victim in victims:
        ray.kill(victim)


def test_a_frozen_actor_stops_answering_until_it_is_thawed(ray_cluster):
    victim = Victim.remote()
    pid = ray.get(victim.pid.remote())
    assert freeze_actor("Victim") == pid
    try:
        with pytest.raises(ray.exceptions.GetTimeoutError):
            ray.get(victim.pid.remote(), timeout=3)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ray.get(victim.pid.remote(), timeout=60) == pid
    ray.kill(victim)
