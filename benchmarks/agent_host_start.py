"""Seconds from starting the agent host (python -m grpo_dist.agent.host) to its first agent's first
request answered: what each rollout call of agent episodes pays before its first round.

    python benchmarks/agent_host_start.py [--repeats 5]

The agent is grpo_dist.agent.examples:chat; its request goes to a closed port, so the answer is a
refused connection (no endpoint, no engine: only the host's start and the client's first call).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

JOB = {"agent": "grpo_dist.agent.examples:chat", "api_key": "key", "concurrency": 1, "timeout_s": 10,
       "episodes": [{"id": "a", "base_url": "http://127.0.0.1:9/v1", "task": {"prompt": "hi"}}]}


def host_start_s() -> float:
    started = time.perf_counter()
    host = subprocess.Popen([sys.executable, "-m", "grpo_dist.agent.host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert host.stdin is not None and host.stdout is not None
    host.stdin.write(json.dumps(JOB) + "\n")
    host.stdin.flush()
    host.stdout.readline()  # started
    host.stdout.readline()  # its result: the refused connection
    elapsed = time.perf_counter() - started
    host.kill()
    host.wait()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    times = [host_start_s() for _ in range(parser.parse_args().repeats)]
    print(f"agent host start to first request: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}, {len(times)} runs)")


if __name__ == "__main__":
    main()
