"""What bounding inline rewards costs: the default job's 256 `exact_answer` scores a step, three ways.

    PYTHONPATH=. .venv/bin/python benchmarks/inline_scoring.py [--repeats 200]

`score_chunk` (inline: the calls on a thread under reward.timeout_s, output capped), the same
calls in a plain loop (inline before it was bounded) and on the thread alone (`call_in_order`),
and through the scoring pool (one process, warmed up), taking turns. Median and 90th percentile
milliseconds per 256 scores.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

from grpo_dist.config.schema import load_config
from grpo_dist.reward.bounded import call_in_order
from grpo_dist.reward.pool import ScoringPool, call_outcome
from grpo_dist.reward.registry import load_reward, reward_spec
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.common.types import Completion, Group

GROUPS, GROUP_SIZE = 32, 8


def groups() -> list[Group]:
    """32 prompts with 8 completions each, half of them right."""
    texts = [f"<answer>{n % 2}</answer>" for n in range(GROUP_SIZE)]
    return [Group(prompt_index=i, row={"prompt": "p", "answer": "1"}, prompt="p", prompt_ids=[], policy_version=0,
                  completions=[Completion([0] * 8, [0.0] * 8, t, "stop") for t in texts]) for i in range(GROUPS)]


def milliseconds(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    """Median and 90th percentile of each run's time, the runs taking turns (a shared machine's
    load then weighs on each alike)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(1000 * (time.perf_counter() - start))
    return {name: {"median_ms": round(statistics.median(t), 3), "p90_ms": round(sorted(t)[int(0.9 * len(t))], 3)}
            for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    worker = RewardWorker(load_config(None, []).reward)
    items = [("p", c.text, {"answer": "1"}) for g in groups() for c in g.completions]
    reward = load_reward("exact_answer")
    calls = [functools.partial(call_outcome, reward, item) for item in items]
    with ScoringPool(1, 10.0) as pool:
        pool.score(reward_spec("exact_answer"), items)  # started and warm
        print(json.dumps(milliseconds({
            "score_chunk": lambda: worker.score_chunk(groups()),
            "plain_loop": lambda: [call() for call in calls],
            "bounded_loop": lambda: call_in_order(calls, 10.0, "bench"),
            "scoring_pool": lambda: pool.score(reward_spec("exact_answer"), items),
        }, args.repeats)))


if __name__ == "__main__":
    main()
