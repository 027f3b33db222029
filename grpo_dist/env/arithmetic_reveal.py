"""arithmetic_reveal: a sum whose second addend is shown only after a first reply, a built-in multi-turn task.

The opening is the row's question with its second addend hidden (`58+67=` opens as `58+=`), so
the first reply is a guess, right only by luck (about 1 in 100). Whatever it was, a wrong reply
is met by the whole question (`58+67=`), once more per extra turn (env.max_turns): the success
has to come from a later turn, which has to read the observation. A right answer ends the
episode with reward 1.0 at any attempt; the episode's reward is its success within max_turns.
Text in, text out, no chat template, in the default model's alphabet; the model is warm-started
on such two-turn transcripts (tasks/arithmetic_reveal.py).
"""

from __future__ import annotations

from typing import Any

from grpo_dist.env.base import Environment, Step
from grpo_dist.reward.rules import exact_answer


def hide_addend(prompt: str) -> str:
    """`58+67=` -> `58+=`: the question with its second addend hidden."""
    first, plus, _ = prompt.partition("+")
    if not plus:
        raise ValueError(f"not a sum a+b=: {prompt!r}")
    return f"{first}+="


class ArithmeticReveal(Environment):
    def __init__(self) -> None:
        self.prompt, self.answer, self.attempts = "", "", 0

    def reset(self, row: dict[str, Any]) -> str:
        self.prompt, self.answer = row["prompt"], str(row["answer"])
        return hide_addend(self.prompt)

    def step(self, reply: str) -> Step:
        self.attempts += 1
        info = {"attempt": self.attempts}
        if exact_answer(self.prompt, reply, self.answer) == 1.0:
            return Step(reward=1.0, done=True, info={**info, "correct": True})
        return Step(observation=self.prompt, reward=0.0, info={**info, "correct": False})
