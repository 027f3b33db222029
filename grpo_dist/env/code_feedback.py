"""code_feedback: write a function, see the public tests fail, try again (bundled code problems).

A row's tests (grpo_dist/tasks/code) are split: the first `public_tests` are run on every
attempt in the sandbox (reward/unit_tests.py) and their failures come back as the next user
turn; the rest are hidden and score the attempt. The episode ends when the public tests pass
(or at env.max_turns). Attempt k (from 1) scores hidden_pass_rate * discount^(k-1); each step's
reward is its attempt's score minus the previous attempt's, so that whatever turn the episode
ends on, the step rewards sum to the score of its last attempt.
"""

from __future__ import annotations

from typing import Any

from grpo_dist.env.base import Environment, Step
from grpo_dist.reward.unit_tests import extract_code, run_tests

def program_trace(stderr: str) -> str:
    """The sandbox's stderr without the harness's own traceback frames (each a File line in
    sandbox.py and the source line under it): what the program and its tests did."""
    lines, skip = [], False
    for line in stderr.splitlines():
        if 'sandbox.py", line' in line:
            skip = True
        elif skip:
            skip = False
        else:
            lines.append(line)
    return "\n".join(lines).strip()


INSTRUCTIONS = "\nAnswer with the whole function in one ```python block."


class CodeFeedback(Environment):
    def __init__(self, public_tests: int = 2, discount: float = 0.8, timeout_s: float = 5.0,
                 memory_mb: int = 512) -> None:
        if public_tests < 1 or not 0 < discount <= 1:
            raise ValueError(f"public_tests >= 1 and 0 < discount <= 1, got {public_tests} and {discount}")
        self.public_count, self.discount = public_tests, discount
        self.limits = {"timeout_s": timeout_s, "memory_mb": memory_mb}
        self.public: list[str] = []
        self.hidden: list[str] = []
        self.attempts, self.score = 0, 0.0

    def reset(self, row: dict[str, Any]) -> str:
        tests = list(row["tests"])
        self.public, self.hidden = tests[: self.public_count], tests[self.public_count:] or tests
        return row["prompt"] + INSTRUCTIONS

    def step(self, reply: str) -> Step:
        self.attempts += 1
        code = extract_code(reply)
        public = run_tests(code, self.public, **self.limits)
        hidden = run_tests(code, self.hidden, **self.limits)
        score = hidden.passed / hidden.total * self.discount ** (self.attempts - 1)
        reward, self.score = score - self.score, score
        info = {"attempt": self.attempts, "public_passed": public.passed, "hidden_passed": hidden.passed,
                "hidden_total": hidden.total, "status": public.status}
        if public.passed == public.total:
            return Step(reward=reward, done=True, info=info)
        feedback = (f"{public.passed} of {public.total} tests passed ({public.status}).\n"
                    f"{program_trace(public.stderr_tail)[-600:]}\nFix the function and answer with it again.")
        return Step(observation=feedback, reward=reward, info=info)
