"""Where an agent call's time goes outside the engine: per-hop timestamps of every call of a rollout call.

    python benchmarks/agent_hops.py [--episodes 32] [--max-new-tokens 16] [--repeats 3] [--threads 2]

The setup of benchmarks/agents.py (a tiny ChatML Llama on the transformers engine, `--episodes`
agents at once, 2 turns each). Every hop is stamped with time.perf_counter (CLOCK_MONOTONIC, one
clock for the worker and the agent host): the agent sends (`sent`), the endpoint's handler is
entered (`handler`), the request is on the Board (`board`), its round starts (`round`), the engine
returns (`engine_end`), the answer leaves the handler (`answered`), the agent has the reply
(`received`). Per run and turn it prints each hop's first..last, in seconds from the call's start.
The timestamps come from wrappers around the endpoint's handler, Board.submit and the runner's
round; the wrapped code is the worker's own.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from typing import Any

HOPS = ["sent", "handler", "board", "round", "engine_end", "answered", "received"]


async def timed_countdown(task: dict[str, Any], client: Any) -> dict[str, Any]:
    """Two turns through the OpenAI client (benchmarks/agents.py's countdown); info: each call's
    (sent, received) perf_counter."""
    messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
    marks = []
    for left in (1, 0):
        sent = time.perf_counter()
        reply = await client.chat.completions.create(model="policy", messages=messages)
        marks.append((sent, time.perf_counter()))
        messages.append(reply.choices[0].message)
        if left:
            messages.append({"role": "user", "content": f"{left} left, again"})
    return {"reward": 1.0, "marks": marks}


def instrument(stamps: dict[tuple[str, int], dict[str, float]], rounds: list[float]) -> None:
    """Wrap the handler, Board.submit and the runner's round so that they stamp `stamps[(episode id, turn)]`."""
    from grpo_dist.agent.board import Board
    from grpo_dist.agent.runner import AgentRunner
    from grpo_dist.agent.server import AgentServer

    submit, chat, serve = Board.submit, AgentServer._chat, AgentRunner._serve

    def timed_submit(self: Any, episode_id: str, request: Any, answer: Any) -> None:
        key = (episode_id, sum(m.role == "assistant" for m in request.messages))
        stamps[key]["board"] = time.perf_counter()
        submit(self, episode_id, request, answer)

    async def timed_chat(self: Any, request: Any) -> Any:
        entered = time.perf_counter()
        response = await chat(self, request)
        turn = int(json.loads(response.text)["id"].rsplit("-", 1)[1])  # chatcmpl-<episode id>-<turn>
        stamps[(request.match_info["episode_id"], turn)].update(handler=entered, answered=time.perf_counter())
        return response

    def timed_serve(self: Any, round_: Any) -> None:
        rounds.append(time.perf_counter())
        serve(self, round_)

    Board.submit, AgentServer._chat, AgentRunner._serve = timed_submit, timed_chat, timed_serve  # type: ignore


def main() -> None:
    import torch

    from agents import TimedEngine
    from grpo_dist.agent.config import AgentConfig
    from grpo_dist.agent.runner import AgentRunner
    from grpo_dist.common.seeding import prompt_seed
    from grpo_dist.common.types import SamplingSettings
    from grpo_dist.rollout.hf_engine import HFEngine
    from grpo_dist.tasks.tiny import IM_END, save_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in [("--episodes", 32), ("--max-new-tokens", 16), ("--repeats", 3), ("--threads", 2)]:
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    stamps: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    rounds: list[float] = []
    instrument(stamps, rounds)
    folder = tempfile.mkdtemp(prefix="agent_hops_")
    save_tiny_model(folder, "llama", chat=True, max_positions=1024, generation_config={"eos_token_id": [IM_END]})
    engine = TimedEngine(HFEngine(folder))
    runner = AgentRunner(engine, engine.engine.tokenizer, AgentConfig(
        name="agent_hops:timed_countdown", timeout_s=120, max_turns=2, max_episode_tokens=1024,
        concurrency=args.episodes))
    rows = [{"prompt": f"Count down from {i}."} for i in range(args.episodes)]
    seeds = [prompt_seed(0, 0, i) for i in range(args.episodes)]
    for repeat in range(args.repeats):
        time.sleep(5)  # the spare host's imports, untimed
        stamps.clear()
        rounds.clear()
        engine.calls, started = [], time.perf_counter()
        episodes = [group[0] for group in runner.run(rows, SamplingSettings(n=1, max_new_tokens=args.max_new_tokens),
                                                      seeds)]
        total = time.perf_counter() - started
        assert all(e.error is None for e in episodes), [e.error for e in episodes if e.error][:1]
        generate_s = sum(seconds for _, seconds in engine.calls)
        print(f"run {repeat}: {total:.3f} s, engine {generate_s:.3f} s, outside the engine {total - generate_s:.3f} s")
        for episode in episodes:
            for turn, (sent, received) in enumerate(episode.infos[0]["marks"]):
                stamps[(episode.episode_id, turn)].update(sent=sent, received=received, round=rounds[turn],
                                                          engine_end=sum(engine.calls[turn]))
        for turn in range(2):
            hops = {hop: [s[hop] - started for (_, t), s in stamps.items() if t == turn] for hop in HOPS}
            print(f"  turn {turn}: " + "  ".join(f"{hop} {min(v):.3f}..{max(v):.3f}" for hop, v in hops.items()))
        print(f"  the last reply received {max(s['received'] for s in stamps.values()) - started:.3f}, "
              f"run() returned {total:.3f}")


if __name__ == "__main__":
    main()
