"""Unit-test reward throughput through a RewardWorker: small programs per second, 1 and 2 processes.

    .venv/bin/python benchmarks/reward_worker_throughput.py [--programs 72]

Each program is a bundled problem's reference solution in a ```python block, scored by
`unit_tests` (every run passes, else the benchmark fails). The workers are warmed up first,
so the rate is steady-state scoring, not process start-up.
"""

from __future__ import annotations

import argparse
import time

from grpo_dist.config.schema import load_config
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.tasks.code import load_problems
from grpo_dist.common.types import Completion, Group


def groups_of(problems: list[dict]) -> list[Group]:
    """One group of one completion (the reference solution) per problem."""
    return [
        Group(prompt_index=i, row=p, prompt=p["prompt"], prompt_ids=[], policy_version=0,
              completions=[Completion([], [], f"```python\n{p['reference']}```", "stop")])
        for i, p in enumerate(problems)
    ]


def measure(problems: list[dict], processes: int) -> float:
    """Programs per second for a RewardWorker with `processes` scoring processes."""
    config = load_config(None, [
        "reward.functions=[{name: unit_tests}]", "reward.accuracy_from=unit_tests", f"reward.processes={processes}",
    ])
    worker = RewardWorker(config.reward)
    try:
        worker.score(groups_of(problems[:processes]))  # start and warm every process
        start = time.perf_counter()
        scored, failures = worker.score(groups_of(problems))
        elapsed = time.perf_counter() - start
    finally:
        worker.close()
    assert all(g.rewards == [1.0] for g in scored) and failures == {"reward/unit_tests/failures": 0.0}
    return len(problems) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=72, help="programs per measurement")
    args = parser.parse_args()
    problems = load_problems()
    problems = (problems * (args.programs // len(problems) + 1))[: args.programs]
    print(f"{args.programs} programs each")
    print(f"{'processes':>9}  {'programs/s':>10}  {'ms/program':>10}")
    for processes in (1, 2):
        rate = measure(problems, processes)
        print(f"{processes:>9}  {rate:>10.1f}  {1000 / rate:>10.1f}")


if __name__ == "__main__":
    main()
