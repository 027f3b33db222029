"""python_tool: solve a problem with a Python interpreter as a tool.

A reply holding a ```python block runs the last such block in the sandbox
(reward/unit_tests.py: the model's code runs there, never here) and its stdout and stderr come
back as a tool message; a reply without one is the final answer, scored by `math_answer`
against the row's `answer` (1.0 or 0.0), and ends the episode. A model without a chat template
gets the output as text: set `tool_role: null`. The question is the row's `prompt_field`
(configs/math_tool.yaml: GSM8K's `question`).
"""

from __future__ import annotations

import re
from typing import Any

from grpo_dist.env.base import Environment, Step
from grpo_dist.env.code_feedback import program_trace
from grpo_dist.reward.rules import math_answer
from grpo_dist.reward.unit_tests import run_tests

INSTRUCTIONS = ("\nYou may run Python: reply with one ```python block and its output comes back. "
                "When you know the answer, reply without code, ending with the answer in \\boxed{}.")
PYTHON_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


class PythonTool(Environment):
    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000,
                 tool_role: str | None = "tool", prompt_field: str = "prompt") -> None:
        self.limits = {"timeout_s": timeout_s, "memory_mb": memory_mb}
        self.max_output_chars, self.tool_role, self.prompt_field = max_output_chars, tool_role, prompt_field
        self.answer, self.calls = "", 0

    def reset(self, row: dict[str, Any]) -> str:
        self.answer = str(row["answer"])
        return row[self.prompt_field] + INSTRUCTIONS

    def step(self, reply: str) -> Step:
        blocks = PYTHON_BLOCK.findall(reply)
        if not blocks:  # the final answer
            return Step(reward=math_answer("", reply, self.answer), done=True, info={"calls": self.calls})
        self.calls += 1
        report = run_tests(blocks[-1], ["pass"], **self.limits)
        output = (report.stdout_tail + program_trace(report.stderr_tail)).strip()[-self.max_output_chars:]
        output = output or "(no output)"
        if report.status == "timeout":
            output += f"\n(stopped after {self.limits['timeout_s']} s)"
        info = {"calls": self.calls, "status": report.status}
        if self.tool_role is None:
            return Step(observation=f"\nOutput:\n{output}\n", info=info)
        return Step(observation=[{"role": self.tool_role, "content": output}], info=info)
