"""Fault injection on a real local Ray cluster: find an actor's process by its title, kill it.

Ray titles an actor's worker process `ray::ClassName` (idle) or `ray::ClassName.method`
(busy). A local cluster is made of descendants of the driver that started it (the test
process, or a `python -m grpo_dist.launch` subprocess), so searching below that pid finds
the run's own actors and never another program's. A launch subprocess started in a session
of its own (`start_new_session=True`) holds its whole local cluster in that session, worker
processes included (they get process groups of their own): `kill_session` ends all of it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil


def title(process: psutil.Process) -> str:
    """The process title (Ray rewrites argv), or "" for a process that is gone."""
    try:
        return " ".join(process.cmdline()).strip()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def actor_processes(class_name: str, root_pid: int | None = None) -> list[psutil.Process]:
    """Live descendants of `root_pid` (default: this process) titled `ray::<class_name>[.method]`."""
    return [p for p in psutil.Process(root_pid or os.getpid()).children(recursive=True)
            if title(p) == f"ray::{class_name}" or title(p).startswith(f"ray::{class_name}.")]


def signal_actor(class_name: str, sig: int, root_pid: int | None = None, timeout_s: float = 30.0) -> int:
    """Send `sig` to one `ray::<class_name>` process below `root_pid`; returns its pid.

    Of several, one busy in a method call (titled `ray::<class_name>.<method>`) is chosen, then
    the lowest pid. Waits up to `timeout_s` for such a process to appear (actors start lazily).
    """
    deadline = time.monotonic() + timeout_s
    while not (found := actor_processes(class_name, root_pid)):
        if time.monotonic() > deadline:
            raise LookupError(f"no ray::{class_name} process below pid {root_pid or os.getpid()}")
        time.sleep(0.2)
    victim = min(found, key=lambda p: (not title(p).startswith(f"ray::{class_name}."), p.pid)).pid
    os.kill(victim, sig)
    return victim


def kill_actor(class_name: str, root_pid: int | None = None, timeout_s: float = 30.0) -> int:
    """kill -9 one `ray::<class_name>` process and wait until it is gone; returns its pid."""
    pid = signal_actor(class_name, signal.SIGKILL, root_pid, timeout_s)
    try:
        psutil.Process(pid).wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    return pid


def freeze_actor(class_name: str, root_pid: int | None = None, timeout_s: float = 30.0) -> int:
    """SIGSTOP one `ray::<class_name>` process: a hung engine that never answers; returns its pid.

    The caller ends the freeze (os.kill(pid, SIGCONT)) or the process (SIGKILL) when done.
    """
    return signal_actor(class_name, signal.SIGSTOP, root_pid, timeout_s)


def busy_in(class_name: str, method: str, root_pid: int | None = None, timeout_s: float = 60.0) -> int:
    """The pid of the first `ray::<class_name>` process below `root_pid` seen running `method`
    (titled `ray::<class_name>.<method>`); polls every few milliseconds, so a call of a few tens
    of them is seen when it recurs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in psutil.Process(root_pid or os.getpid()).children(recursive=True):
            if title(process) == f"ray::{class_name}.{method}":
                return process.pid
        time.sleep(0.002)
    raise LookupError(f"no ray::{class_name} process ran {method} within {timeout_s:.0f} s")


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


def wait_alive(handle: Any, restarts: int, timeout_s: float = 60.0) -> None:
    """Wait until Ray's actor table has the actor ALIVE after `restarts` restarts.

    Unlike `wait_restarted` it reads the actor's own record: no other session's processes of the
    same class can satisfy it, and a call made after it never finds the actor restarting.
    """
    from grpo_dist.controller.actors import actor_state

    deadline = time.monotonic() + timeout_s
    while (state := actor_state(handle)) != ("ALIVE", restarts):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the actor is {state[0]} after {state[1]} restarts, not ALIVE after {restarts} "
                               f"within {timeout_s:.0f} s")
        time.sleep(0.2)


def session_processes(leader: int) -> list[psutil.Process]:
    """The live processes of the session `leader` started (its own pid is the session id)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == leader:
                found.append(process)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def kill_session(leader: int, timeout_s: float = 30.0) -> None:
    """kill -9 every process of the session `leader` started (a launch and its local cluster)."""
    processes = session_processes(leader)
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=timeout_s)


class Chaos(threading.Thread):
    """Kills (kill -9) or freezes (SIGSTOP) a random process of `classes` below `root_pid` each
    time `progress()` (steps trained, say) has grown by `every` since the last fault and that
    fault's process is gone (the run kills a frozen actor: a hung actor is a dead one), until
    `stop()`. `faults` lists what it did: (class name, "kill" | "freeze", pid). `stop()` lets
    every frozen process go."""

    def __init__(self, classes: list[str], root_pid: int, progress: Callable[[], int], every: int,
                 seed: int = 0) -> None:
        super().__init__(daemon=True)
        self.classes, self.root_pid, self.progress, self.every = classes, root_pid, progress, every
        self.random = random.Random(seed)
        self.faults: list[tuple[str, str, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        last = 0
        while not self.stopping.wait(0.05):
            if self.progress() < last + self.every:
                continue
            name, action = self.random.choice(self.classes), self.random.choice(["kill", "freeze"])
            found = actor_processes(name, self.root_pid)
            if not found:
                continue  # (between a death and the restart)
            victim = self.random.choice(found).pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
                self.faults.append((name, action, victim))
            while not self.stopping.is_set() and not ended(victim):
                time.sleep(0.1)
            last = self.progress()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
        for _, action, pid in self.faults:
            if action == "freeze":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def ended(pid: int) -> bool:
    """Whether the process has ended (a zombie, not reaped yet, has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
