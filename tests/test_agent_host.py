"""agent/host.py's lifetime: a spare agent host (no engine, no model) ends within seconds of its
owner's kill -9, even while a child the owner forked holds the host's stdin pipe open (so stdin
never ends): no agent host outlives the process that started it."""

import subprocess
import sys
import time

import psutil

# The owner starts a spare host as the rollout worker does, then forks a child that inherits the
# write end of the host's stdin (what any fork without exec does, multiprocessing's default on Linux).
OWNER = """
import os, sys, time
from grpo_dist.agent.runner import spawn_host
host = spawn_host("grpo_dist.agent.examples:chat")
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
print(host.pid, child, flush=True)
time.sleep(120)
"""


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_spare_host_ends_with_its_killed_owner_even_while_its_stdin_stays_open():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    host, child = (int(pid) for pid in owner.stdout.readline().split())
    try:
        owner.kill()  # kill -9, as a CI timeout or a killed rollout worker
        owner.wait()
        deadline = time.monotonic() + 15  # the host's own start (imports: 2-3 s on a loaded machine) counts
        while not ended(host) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended(host), "the agent host outlived its owner"
        assert not ended(child)  # the pipe was still held open: stdin's end did not do it
    finally:
        for pid in (host, child):
            if not ended(pid):
                psutil.Process(pid).kill()
