"""Episodes per second: turn-batched (one engine call per round for every active episode), and
turn-batched in `--waves` waves (env.waves: one wave's environment steps run while another
generates), against one episode at a time, over the same engine, environment and seeds.

    python benchmarks/multiturn.py [--episodes 32] [--turns 4] [--max-new-tokens 16] [--step-s 0.05]
                                   [--repeats 3] [--waves 2]

The engine is the transformers engine on a tiny ChatML Llama (built here, nothing downloaded);
the environment answers each reply after `--step-s` seconds (an async sleep: a sandbox or a
tool call's latency) with a short user message, until `--turns` replies. The baseline plays the
same episodes one after another with the same runner (rows of one episode each, the same seeds),
so both sides produce identical episodes; the table gives the median of `--repeats` runs and the
share of each run's wall time the engine spent outside `generate`: waiting on environments (and
the runner's own work between rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import torch

from grpo_dist.env import Environment, Step
from grpo_dist.env.config import EnvConfig
from grpo_dist.env.runner import EpisodeRunner
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from grpo_dist.common.types import SamplingSettings


class Echo(Environment):
    """Answers every reply after `delay_s` with how many turns are left; ends after `turns` replies."""

    def __init__(self, turns: int = 4, delay_s: float = 0.05) -> None:
        self.turns, self.delay_s = turns, delay_s

    def reset(self, row: dict[str, Any]) -> str:
        return row["prompt"]

    async def step(self, reply: str) -> Step:  # type: ignore[override]
        await asyncio.sleep(self.delay_s)
        self.turns -= 1
        return Step(done=True, reward=1.0) if self.turns == 0 else Step(observation=f"{self.turns} left, again")


class TimedEngine:
    """An engine that counts the seconds spent in its `generate`."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.busy_s = engine, 0.0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.busy_s += time.perf_counter() - started


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--waves", type=int, default=2, help="env.waves of the third mode")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    folder = tempfile.mkdtemp(prefix="multiturn_bench_")
    save_tiny_model(folder, "llama", chat=True, max_positions=1024, generation_config={"eos_token_id": [IM_END]})
    engine = TimedEngine(HFEngine(folder))
    env = EnvConfig(name="__main__:Echo", kwargs={"turns": args.turns, "delay_s": args.step_s},
                    max_turns=args.turns, max_episode_tokens=1024, concurrency=args.episodes)
    runner = EpisodeRunner(engine, engine.engine.tokenizer, env)
    in_waves = EpisodeRunner(engine, engine.engine.tokenizer, env.model_copy(update={"waves": args.waves}))
    sampling = SamplingSettings(n=1, temperature=1.0, max_new_tokens=args.max_new_tokens)
    rows = [{"prompt": f"Count down from {i}."} for i in range(args.episodes)]
    seeds = [prompt_seed(0, 0, i) for i in range(args.episodes)]

    def batched() -> list:
        return [group[0] for group in runner.run(rows, sampling, seeds)]

    def waves() -> list:
        return [group[0] for group in in_waves.run(rows, sampling, seeds)]

    def one_at_a_time() -> list:
        return [runner.run([row], sampling, [seed])[0][0] for row, seed in zip(rows, seeds)]

    modes = {"one episode at a time (baseline)": one_at_a_time, "turn-batched": batched,
             f"turn-batched, {args.waves} waves": waves}
    timings: dict[str, list[float]] = {name: [] for name in modes}
    waiting: dict[str, list[float]] = {name: [] for name in timings}
    for _ in range(args.repeats):
        for name, play in modes.items():
            engine.busy_s, started = 0.0, time.perf_counter()
            episodes = play()
            seconds = time.perf_counter() - started
            timings[name].append(seconds)
            waiting[name].append(1 - engine.busy_s / seconds)
            assert all(e.error is None for e in episodes)
    print(f"{args.episodes} episodes x {args.turns} turns, {args.max_new_tokens} new tokens per turn, "
          f"environment step {args.step_s} s, torch threads {args.threads}, median of {args.repeats}\n")
    print("| mode | seconds | episodes/s | speedup | engine waiting |\n|---|---|---|---|---|")
    base = statistics.median(timings["one episode at a time (baseline)"])
    for name, values in timings.items():
        seconds = statistics.median(values)
        print(f"| {name} | {seconds:.2f} | {args.episodes / seconds:.1f} | {base / seconds:.1f}x "
              f"| {statistics.median(waiting[name]):.0%} |")


if __name__ == "__main__":
    main()
