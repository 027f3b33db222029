"""arithmetic_retry: the default task's sums with a second chance, a built-in multi-turn task.

The opening is the row's prompt (`58+67=`); a wrong answer is met by the same question again,
once more per extra turn (env.max_turns). A right answer ends the episode with reward
`discount`^(attempt - 1): 1.0 at the first attempt, 0.5 at the second by default. The
default model is carry-confused (tasks/arithmetic.py): it answers with the digit-wise sum when a
carry occurs, so a second attempt that repeats the first is wrong again, and what pays at the
second turn (the other habit, having seen the first answer fail) is not what pays at the first.
Text in, text out, no chat template: the observation is the question, in the model's alphabet.
"""

from __future__ import annotations

from typing import Any

from grpo_dist.env.base import Environment, Step
from grpo_dist.reward.rules import exact_answer


class ArithmeticRetry(Environment):
    def __init__(self, discount: float = 0.5) -> None:
        if not 0 <= discount <= 1:
            raise ValueError(f"discount must be in [0, 1], got {discount}")
        self.discount = discount
        self.prompt, self.answer, self.attempts = "", "", 0

    def reset(self, row: dict[str, Any]) -> str:
        self.prompt, self.answer = row["prompt"], str(row["answer"])
        return self.prompt

    def step(self, reply: str) -> Step:
        self.attempts += 1
        info = {"attempt": self.attempts}
        if exact_answer(self.prompt, reply, self.answer) == 1.0:
            return Step(reward=self.discount ** (self.attempts - 1), done=True, info={**info, "correct": True})
        return Step(observation=self.prompt, reward=0.0, info={**info, "correct": False})
