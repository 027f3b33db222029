"""What bounding inline rewards costs: the default job's 256 `exact_answer` scores a step, three ways.

    PYTHONPATH=. .venv/bin/python benchmarks/inline_scoring.py [--repeats 200]

`score_chunk` (inline: the calls on a thread under reward.timeout_s, output capped), the same
calls in a plain loop (inline before it was bounded) and on the thread alone (`call_in_order`),
and through the scoring pool (one process, warmed up). Median and 90th percentile milliseconds per 256 scores.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

from grpo_dist.config import load_config
from grpo_dist.reward.bounded import call_in_order
from grpo_dist.reward.pool import ScoringPool, call_outcome
from grpo_dist.reward.registry import load_reward, reward_spec
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.types import Completion, Group

GROUPS, GROUP_SIZE = 32, 8


def groups() -> list[Group]:
    """32 prompts with 8 completions each, half of them right."""
    texts = [f"<answer>{n % 2}</answer>" for n in range(GROUP_SIZE)]
    return [Group(prompt_index=i, row={"prompt": "p", "answer": "1"}, prompt="p", prompt_ids=[], policy_version=0,
                  completions=[Completion([0] * 8, [0.0] * 8, t, "stop") for t in texts]) for i in range(GROUPS)]


def milliseconds(run: Callable[[], object], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    return {"median_ms": round(statistics.median(times), 3), "p90_ms": round(times[int(0.9 * len(times))], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    worker = RewardWorker(load_config(None, []).reward)
    items = [("p", c.text, {"answer": "1"}) for g in groups() for c in g.completions]
    reward = load_reward("exact_answer")
    results = {"bounded_score_chunk": milliseconds(lambda: worker.score_chunk(groups()), args.repeats),
               "plain_loop": milliseconds(lambda: [call_outcome(reward, item) for item in items], args.repeats)}
    calls = [functools.partial(call_outcome, reward, item) for item in items]
    results["bounded_loop"] = milliseconds(lambda: call_in_order(calls, 10.0, "bench"), args.repeats)
    with ScoringPool(1, 10.0) as pool:
        pool.score(reward_spec("exact_answer"), items)  # started and warm
        results["scoring_pool"] = milliseconds(lambda: pool.score(reward_spec("exact_answer"), items), args.repeats)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
