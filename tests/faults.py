"""Fault injection on a real local Ray cluster: find an actor's process by its title, kill it.

Ray titles an actor's worker process `ray::ClassName` (idle) or `ray::ClassName.method`
(busy). A local cluster is made of descendants of the driver that started it (the test
process, or a `python -m grpo_dist.launch` subprocess), so searching below that pid finds
the run's own actors and never another program's.
"""

from __future__ import annotations

import os
import signal
import time

import psutil


def actor_processes(class_name: str, root_pid: int | None = None) -> list[psutil.Process]:
    """Live descendants of `root_pid` (default: this process) titled `ray::<class_name>`."""
    found = []
    for process in psutil.Process(root_pid or os.getpid()).children(recursive=True):
        try:
            title = " ".join(process.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if title == f"ray::{class_name}" or title.startswith((f"ray::{class_name}.", f"ray::{class_name} ")):
            found.append(process)
    return found


def kill_actor(class_name: str, root_pid: int | None = None, timeout_s: float = 30.0) -> int:
    """kill -9 one `ray::<class_name>` process below `root_pid` (the lowest pid when several); returns its pid.

    Waits up to `timeout_s` for such a process to appear, since actors start lazily.
    """
    deadline = time.monotonic() + timeout_s
    while not (found := actor_processes(class_name, root_pid)):
        if time.monotonic() > deadline:
            raise LookupError(f"no ray::{class_name} process below pid {root_pid or os.getpid()}")
        time.sleep(0.2)
    victim = min(found, key=lambda p: p.pid)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    return victim.pid


def wait_restarted(class_name: str, old_pid: int, root_pid: int | None = None, count: int = 1,
                   timeout_s: float = 60.0) -> list[int]:
    """Wait until `count` `ray::<class_name>` processes run and `old_pid` is not one; returns their pids.

    `count` is how many actors of the class the run has. A process is there once Ray has
    restarted the actor's worker; its constructor may still be running, so call a method
    (ray.get) before relying on its state.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [p.pid for p in actor_processes(class_name, root_pid)]
        if len(pids) >= count and old_pid not in pids:
            return pids
        time.sleep(0.2)
    raise TimeoutError(f"ray::{class_name} was not restarted within {timeout_s:.0f} s (old pid {old_pid})")
