"""Sandbox throughput: small programs per second through run_tests, with 1 and 2 threads,
and the CPU time each program costs in the sandbox's processes (launcher and sandbox).

    .venv/bin/python benchmarks/sandbox_throughput.py [--programs 40]
"""

from __future__ import annotations

import argparse
import resource
import time
from concurrent.futures import ThreadPoolExecutor

from grpo_dist.reward.unit_tests import run_tests
from grpo_dist.tasks.code import load_problems


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(problems: list[dict], workers: int) -> tuple[float, float]:
    """Programs per second, and CPU ms per program in the sandbox's processes, running each
    reference against its tests with `workers` threads."""
    start, cpu_start = time.perf_counter(), children_cpu_s()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        reports = list(pool.map(lambda p: run_tests(p["reference"], p["tests"]), problems))
    elapsed, cpu = time.perf_counter() - start, children_cpu_s() - cpu_start
    assert all(r.status == "passed" for r in reports), [r for r in reports if r.status != "passed"]
    return len(problems) / elapsed, 1000 * cpu / len(problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40, help="programs per measurement")
    args = parser.parse_args()
    problems = load_problems()
    problems = (problems * (args.programs // len(problems) + 1))[: args.programs]
    isolation = run_tests("x = 1", ["assert x == 1"]).isolation  # also warms the page cache
    print(f"isolation: {', '.join(isolation) or 'none'}; {args.programs} programs each")
    print(f"{'workers':>7}  {'programs/s':>10}  {'ms/program':>10}  {'CPU ms/program':>14}")
    for workers in (1, 2):
        rate, cpu_ms = measure(problems, workers)
        print(f"{workers:>7}  {rate:>10.1f}  {1000 / rate:>10.1f}  {cpu_ms:>14.1f}")


if __name__ == "__main__":
    main()
