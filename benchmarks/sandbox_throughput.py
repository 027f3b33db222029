"""Sandbox throughput: small programs per second through run_tests, with 1 and 2 threads.

    .venv/bin/python benchmarks/sandbox_throughput.py [--programs 40]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from grpo_dist.reward.code import run_tests
from grpo_dist.tasks.code import load_problems


def measure(problems: list[dict], workers: int) -> float:
    """Programs per second running each reference against its tests with `workers` threads."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        reports = list(pool.map(lambda p: run_tests(p["reference"], p["tests"]), problems))
    elapsed = time.perf_counter() - start
    assert all(r.status == "passed" for r in reports), [r for r in reports if r.status != "passed"]
    return len(problems) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40, help="programs per measurement")
    args = parser.parse_args()
    problems = load_problems()
    problems = (problems * (args.programs // len(problems) + 1))[: args.programs]
    isolation = run_tests("x = 1", ["assert x == 1"]).isolation  # also warms the page cache
    print(f"isolation: {', '.join(isolation) or 'none'}; {args.programs} programs each")
    print(f"{'workers':>7}  {'programs/s':>10}  {'ms/program':>10}")
    for workers in (1, 2):
        rate = measure(problems, workers)
        print(f"{workers:>7}  {rate:>10.1f}  {1000 / rate:>10.1f}")


if __name__ == "__main__":
    main()
