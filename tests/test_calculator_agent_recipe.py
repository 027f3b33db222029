"""configs/smollm2_calculator_agent.yaml and its agent (grpo_dist/tasks/calculator_sums.py): the
config composes, the shipped splits are the generator's and disjoint, and the agent runs the
calculator for the model's call and scores the final reply. The client is a stand-in for the
endpoint (it answers with fixed replies and records the requests)."""

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import read_jsonl
from grpo_dist.tasks.calculator_sums import make_splits, solve

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "smollm2_calculator_agent.yaml"


class ScriptedClient:
    """`client.chat.completions.create` answering with the next of `replies` (OpenAI-shaped messages)."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        self.chat = SimpleNamespace(completions=self)

    async def create(self, **request):
        self.requests.append(json.loads(json.dumps(request, default=vars)))
        return SimpleNamespace(choices=[SimpleNamespace(message=self.replies.pop(0))])


def call(expression):
    function = SimpleNamespace(name="calculator", arguments=json.dumps({"expression": expression}))
    return SimpleNamespace(id="call_1", type="function", function=function)


def test_the_recipe_composes_and_its_splits_are_shipped_and_disjoint():
    config = load_config(CONFIG)
    assert config.agent.name == "grpo_dist.tasks.calculator_sums:solve" and config.env is None
    train, held_out = make_splits()
    assert read_jsonl(config.data.train) == train and read_jsonl(config.data.eval) == held_out
    assert len(train) == 1000 and len(held_out) == 200
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(int(r["answer"]) == sum(map(int, r["prompt"][8:-1].split(" + "))) for r in train + held_out)


def test_the_agent_runs_the_models_call_and_scores_the_final_reply():
    task = {"prompt": "What is 23 + 48?", "answer": "71"}
    client = ScriptedClient([SimpleNamespace(content=None, tool_calls=[call("23 + 48")], role="assistant"),
                             SimpleNamespace(content="The answer is 71.", tool_calls=None, role="assistant")])
    assert asyncio.run(solve(task, client)) == {"reward": 1.0, "tool_calls": 1}
    first, second = client.requests
    assert first["messages"][-1] == {"role": "user", "content": "What is 23 + 48?"}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "71"}
    unaided = ScriptedClient([SimpleNamespace(content="23 + 48 = 71, or 61", tool_calls=None, role="assistant")])
    assert asyncio.run(solve(task, unaided)) == {"reward": 0.0, "tool_calls": 0}  # the last number counts
