"""Chat templates and environments written for the multi-turn tests (tests/test_env_*.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from grpo_dist.env import Environment, Step
from grpo_dist.tasks.tiny import CHATML, build_tokenizer

LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3 = (
    "<|begin_of_text|>"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# ChatML that strips the reasoning (<think>...</think>) of assistant turns before the last user
# message, as Qwen3's template does: it rewrites history.
STRIPPING = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "stripping": STRIPPING}
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "stripping": "<|im_end|>"}


def chat_tokenizer(template: str) -> Any:
    """The tiny character tokenizer with the named template (and Llama-3's special tokens for llama3)."""
    if template == "llama3":
        tokenizer = build_tokenizer(added=LLAMA3_TOKENS)
        tokenizer.chat_template = LLAMA3
        return tokenizer
    tokenizer = build_tokenizer(chat=True)
    tokenizer.chat_template = TEMPLATES[template]
    return tokenizer


class Countdown(Environment):
    """Says how many turns are left until the last; reward 1 per reply containing the row's answer."""

    def __init__(self, turns: int = 3, role: str = "user") -> None:
        self.turns, self.role, self.answer = turns, role, ""

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.answer = row["answer"]
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, reply: str) -> Step:
        self.turns -= 1
        reward = float(self.answer in reply)
        if self.turns == 0:
            return Step(done=True, reward=reward, info={"last": reply})
        return Step(observation=[{"role": self.role, "content": f"{self.turns} left"}], reward=reward)


class AsyncCountdown(Countdown):
    """Countdown with async reset and step, each taking `delay_s`."""

    def __init__(self, turns: int = 3, delay_s: float = 0.0) -> None:
        super().__init__(turns)
        self.delay_s = delay_s

    async def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:  # type: ignore[override]
        await asyncio.sleep(self.delay_s)
        return super().reset(row)

    async def step(self, reply: str) -> Step:  # type: ignore[override]
        await asyncio.sleep(self.delay_s)
        return super().step(reply)


class BadEnv(Countdown):
    """Misbehaves on rows whose `bad` field says how: raise, malformed, hang (sync sleep), none;
    in reset: reset_raise, reset_hang, huge_opening (16 MiB); huge: a 16 MiB observation;
    none_at_end: the last step's observation is None."""

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.bad = row.get("bad", "none")
        if self.bad == "reset_raise":
            raise RuntimeError("reset broke")
        if self.bad == "reset_hang":
            time.sleep(60)
        if self.bad == "huge_opening":
            return [{"role": "user", "content": "x" * (1 << 24)}]
        return super().reset(row)

    def step(self, reply: str) -> Any:
        if self.bad == "raise":
            raise RuntimeError("the environment broke")
        if self.bad == "malformed":
            return {"observation": "not a Step"}
        if self.bad == "hang":
            time.sleep(60)
        if self.bad == "huge":
            return Step(observation=[{"role": "user", "content": "x" * (1 << 24)}])
        step = super().step(reply)
        return Step(observation=None, done=True) if self.bad == "none_at_end" and step.done else step


class AsyncBadEnv(Countdown):
    """Async reset and step that misbehave on rows whose `bad` field says how: hang (awaits
    forever), block (a sync sleep that blocks the event loop), in reset: reset_hang, reset_block."""

    async def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:  # type: ignore[override]
        self.bad = row.get("bad", "none")
        await self.misbehave("reset_")
        return super().reset(row)

    async def step(self, reply: str) -> Step:  # type: ignore[override]
        await self.misbehave("")
        return super().step(reply)

    async def misbehave(self, prefix: str) -> None:
        if self.bad == f"{prefix}hang":
            await asyncio.sleep(60)
        if self.bad == f"{prefix}block":
            time.sleep(4)  # noqa: ASYNC251 - on purpose: the loop is blocked


class NotAnEnvironment:
    """A class that does not subclass Environment (refused by name)."""


class TimedCountdown(Countdown):
    """Countdown whose sync steps take `delay_s` each and are logged, with the episode's seed, in
    the class list `steps` as (seed, started, ended) perf_counter times."""

    steps: list[tuple[int, float, float]] = []

    def __init__(self, turns: int = 3, delay_s: float = 0.1) -> None:
        super().__init__(turns)
        self.delay_s = delay_s

    def step(self, reply: str) -> Step:
        started = time.perf_counter()
        time.sleep(self.delay_s)
        TimedCountdown.steps.append((self.seed, started, time.perf_counter()))
        return super().step(reply)


class BrokenReset(Countdown):
    """Raises in every reset: every episode fails. Takes any options (a recipe's env.kwargs)."""

    def __init__(self, **options: Any) -> None:
        super().__init__()

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        raise RuntimeError("reset broke")
