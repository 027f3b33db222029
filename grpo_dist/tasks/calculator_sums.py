"""Two-digit sums that SmolLM2-135M-Instruct gets wrong unaided, and an agent that offers it a
calculator tool (configs/smollm2_calculator_agent.yaml, agent.name: grpo_dist.tasks.calculator_sums:solve).

The agent shows the model one example exchange first (a call, its tool reply, the answer): zero-shot
the 135M model never calls a tool (benchmarks/tool_calls.py). `python -m grpo_dist.tasks.calculator_sums`
rewrites grpo_dist/tasks/assets/calculator_sums/; the splits are disjoint by the pair (a, b).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from grpo_dist.agent.examples import CALCULATOR, evaluate
from grpo_dist.tasks.splits import splits_main

ASSET_DIR = Path(__file__).parent / "assets" / "calculator_sums"
EXAMPLE = [{"role": "user", "content": "What is 17 + 25?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_example", "type": "function", "function": {
               "name": "calculator", "arguments": '{"expression": "17 + 25"}'}}]},
           {"role": "tool", "tool_call_id": "call_example", "content": "42"},
           {"role": "assistant", "content": "The answer is 42."}]
NUMBER = re.compile(r"-?\d+")


def make_splits(seed: int = 0, train_rows: int = 1000, eval_rows: int = 200) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows "What is a + b?" for a, b in 10..99, shuffled once with `seed`:
    the first `eval_rows` pairs are held out, the next `train_rows` train, so no pair is in both."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if (a, b) != (17, 25)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs[:eval_rows + train_rows]]
    return rows[eval_rows:], rows[:eval_rows]


def last_number_is(answer: str, content: str | None) -> float:
    """1.0 when the reply's last integer is the answer (a reply that lists many numbers cannot guess)."""
    numbers = NUMBER.findall(content or "")
    return float(bool(numbers) and numbers[-1] == answer)


def tool_messages(calls: list[Any]) -> list[dict[str, Any]]:
    """The calculator's reply to each call (an error text for arguments it cannot read)."""
    replies = []
    for call in calls:
        try:
            expression = str(json.loads(call.function.arguments).get("expression", ""))
        except (ValueError, AttributeError):
            expression = ""
        result = evaluate(expression) if call.function.name == "calculator" else "error: no such tool"
        replies.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return replies


async def solve(task: dict[str, Any], client: Any) -> dict[str, Any]:
    """Asks the sum after the example; runs the calls of the reply once and asks again. Reward 1
    when the final reply's last number is the answer."""
    messages: list[Any] = [*EXAMPLE, {"role": "user", "content": task["prompt"]}]
    message = (await client.chat.completions.create(model="policy", messages=messages,
                                                    tools=[CALCULATOR])).choices[0].message
    calls = message.tool_calls or []
    if calls:
        messages += [message, *tool_messages(calls)]
        message = (await client.chat.completions.create(model="policy", messages=messages,
                                                        tools=[CALCULATOR])).choices[0].message
    return {"reward": last_number_is(task["answer"], message.content), "tool_calls": len(calls)}


def main() -> None:
    splits_main(__doc__.split("\n")[0], ASSET_DIR, make_splits)


if __name__ == "__main__":
    main()
