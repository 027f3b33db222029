"""Small agents written against the OpenAI API, as a user would (agent.name: grpo_dist.agent.examples:NAME).

`chat`: one question, reward 1 when the reply contains the row's answer. `calculator`: offers a
`calculator` tool, runs the calls the model makes and asks again with their results; reward 1
when the final reply contains the answer. Tasks are dataset rows with "prompt" and "answer".
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression (+, -, *, /, parentheses).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg}


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression, or an error message the model can read."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")
    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def answered(task: dict[str, Any], content: str | None) -> float:
    return float(str(task.get("answer", "")) in (content or ""))


async def chat(task: dict[str, Any], client: Any) -> float:
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}])
    return answered(task, reply.choices[0].message.content)


async def calculator(task: dict[str, Any], client: Any) -> dict[str, Any]:
    messages: list[Any] = [{"role": "user", "content": task["prompt"]}]
    message = (await client.chat.completions.create(model="policy", messages=messages,
                                                    tools=[CALCULATOR])).choices[0].message
    calls = message.tool_calls or []
    if calls:
        messages.append(message)  # the client's own message object, as agents usually do
        for call in calls:
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": evaluate(expression)})
        message = (await client.chat.completions.create(model="policy", messages=messages,
                                                        tools=[CALCULATOR])).choices[0].message
    return {"reward": answered(task, message.content), "tool_calls": len(calls)}
