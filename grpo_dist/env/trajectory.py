"""An episode as token ids: the engine's own output ids verbatim, observation ids appended, masks.

`Trajectory` is the heart of token fidelity. With env.history=append (one training sample):

    ids       = opening ids, then per turn: reply ids (the engine's, verbatim), then the ids of
                the template's separator after the reply and of the observation (rendered
                against a fixed base: render.py)
    loss_mask = 1 on reply ids, 0 elsewhere; logprobs = the sampler's on reply ids, 0 elsewhere

Before an observation is appended the prefix check runs: the template's rendering of the
whole conversation must be exactly the text the engine has seen plus the text to append. A
template that rewrites history (strips earlier reasoning) fails it, and the episode ends
(stop reason history_rewritten) with the tokens the engine did see. With
env.history=per_turn each turn is its own sample: the context rendered afresh by the
template (what the engine is then given, mask 0) and that turn's reply (mask 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from grpo_dist.env.base import EnvError, Message, Observation
from grpo_dist.env.render import ChatRenderer, TextRenderer

History = Literal["append", "per_turn"]

# Why an episode ended.
DONE = "done"  # the environment said so
MAX_TURNS = "max_turns"
MAX_EPISODE_TOKENS = "max_episode_tokens"  # prompt + turns reached env.max_episode_tokens
HISTORY_REWRITTEN = "history_rewritten"  # the template re-renders earlier turns (prefix check)
TEMPLATE_MISMATCH = "template_mismatch"  # the base rendering of an observation is not the conversation's
ENV_ERROR = "env_error"  # raised, malformed, or past its deadline: the episode is not trained


@dataclass
class Sample:
    """One training sequence: `ids` with a loss mask and sampler logprobs per id (0 off the mask)."""

    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int  # ids[:prompt_len] are the context the first reply was sampled after


@dataclass
class Trajectory:
    """One episode's tokens, built turn by turn (see the module docstring)."""

    renderer: TextRenderer
    opening: Observation
    max_episode_tokens: int
    max_observation_tokens: int
    history: History = "append"
    messages: list[Message] = field(default_factory=list)  # chat: the conversation so far
    samples: list[Sample] = field(default_factory=list)
    stop_reason: str | None = None
    observations_truncated: int = 0
    _seen: str = ""  # chat, append: the text of everything the engine has seen, as the template renders it
    _pending: str = ""  # the template's separator after the last reply, not yet appended
    _served: list[int] | None = None  # the ids last given to the engine

    def __post_init__(self) -> None:
        if self.renderer.chat:
            self.messages = [{"role": "user", "content": self.opening}] if isinstance(self.opening, str) \
                else list(self.opening)
            self._seen = text = self.renderer.render(self.messages, generation_prompt=True)
        elif isinstance(self.opening, str):
            text = self.opening
        else:
            raise EnvError("reset() returned messages, but the model has no chat template: return a prompt string")
        # a huge opening is refused from a prefix (encoding megabytes takes a minute and gigabytes)
        if len(text) > 8 * self.max_episode_tokens and head_ids(self.renderer.encode, text, self.max_episode_tokens)[1]:
            raise EnvError(f"the opening is more than env.max_episode_tokens={self.max_episode_tokens} tokens")
        ids = self.renderer.opening_ids(self.messages if self.renderer.chat else text)  # type: ignore[arg-type]
        if len(ids) >= self.max_episode_tokens:
            raise EnvError(f"the opening is {len(ids)} tokens, env.max_episode_tokens={self.max_episode_tokens}")
        self.samples.append(Sample(ids, [0] * len(ids), [0.0] * len(ids), len(ids)))

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def prompt_ids(self) -> list[int]:
        return self.samples[0].ids[: self.samples[0].prompt_len]

    def engine_input(self) -> list[int]:
        """What the engine samples the next reply after; with append it must extend what it was
        given last time by exactly the ids appended since (the prefix check on ids)."""
        ids = list(self.samples[-1].ids)
        if self.history == "append" and self._served is not None and ids[: len(self._served)] != self._served:
            raise AssertionError("the episode's ids do not extend what the engine was given before")
        self._served = ids
        return ids

    def add_reply(self, token_ids: list[int], logprobs: list[float], finish_reason: str) -> str:
        """Append the engine's reply verbatim (loss mask 1, its logprobs); returns its text for the
        environment. A reply past env.max_episode_tokens is cut there and ends the episode."""
        sample = self.samples[-1]
        room = self.max_episode_tokens - len(sample.ids)
        if len(token_ids) > room:
            token_ids, logprobs, finish_reason = token_ids[:room], logprobs[:room], "length"
            self.stop_reason = MAX_EPISODE_TOKENS
        sample.ids += token_ids
        sample.loss_mask += [1] * len(token_ids)
        sample.logprobs += list(logprobs)
        content_ids, self._pending = self._split_closing(token_ids, finish_reason)
        if self.renderer.chat:
            content = self.renderer.decode(content_ids)
            self.messages.append({"role": "assistant", "content": content})
            self._seen += content + self.renderer.closing[: len(self.renderer.closing) - len(self._pending)]
        return self.renderer.decode(content_ids, skip_special=True)

    def _split_closing(self, token_ids: list[int], finish_reason: str) -> tuple[list[int], str]:
        """(the reply's content ids, the rest of the template's closing after it). A reply that
        stopped on the token the closing starts with keeps it; the rest is the separator."""
        closing = self.renderer.closing
        if finish_reason == "stop" and token_ids:
            last = self.renderer.decode(token_ids[-1:])
            if last and closing.startswith(last):
                return token_ids[:-1], closing[len(last):]
        return token_ids, closing

    def add_observation(self, observation: Observation) -> None:
        """Append the environment's answer (loss mask 0), or end the episode with a stop reason."""
        if self.history == "per_turn":
            self._next_turn_sample(self._truncated_messages(observation))
        elif self.renderer.chat:
            self._append_messages(self._truncated_messages(observation))
        else:
            if not isinstance(observation, str):
                raise EnvError("Step.observation is messages, but the model has no chat template: return text")
            self._append_ids(self.renderer.encode(self._truncated(observation)))

    def _append_messages(self, new: list[Message]) -> None:
        """The prefix check, then the separator and observation ids appended."""
        renderer: ChatRenderer = self.renderer  # type: ignore[assignment]
        conversation = renderer.render([*self.messages, *new], generation_prompt=True)
        appended = self._pending + renderer.observation_text(new)
        if not conversation.startswith(self._seen + self._pending):
            self.stop_reason = HISTORY_REWRITTEN
        elif conversation != self._seen + appended:
            self.stop_reason = TEMPLATE_MISMATCH
        elif self._append_ids(renderer.encode(appended)):
            self.messages += new
            self._seen = conversation

    def _append_ids(self, ids: list[int]) -> bool:
        sample = self.samples[-1]
        if len(sample.ids) + len(ids) >= self.max_episode_tokens:  # no room left for a reply token
            self.stop_reason = MAX_EPISODE_TOKENS
            return False
        sample.ids += ids
        sample.loss_mask += [0] * len(ids)
        sample.logprobs += [0.0] * len(ids)
        return True

    def _next_turn_sample(self, new: list[Message]) -> None:
        """per_turn: the next sample's context is the conversation rendered afresh."""
        if not self.renderer.chat:
            raise EnvError("env.history=per_turn needs a chat template")
        ids = self.renderer.opening_ids([*self.messages, *new])
        if len(ids) >= self.max_episode_tokens:
            self.stop_reason = MAX_EPISODE_TOKENS
            return
        self.messages += new
        self.samples.append(Sample(ids, [0] * len(ids), [0.0] * len(ids), len(ids)))

    def _truncated_messages(self, observation: Observation) -> list[Message]:
        """The observation as messages (text: one user message), their contents cut to
        env.max_observation_tokens in all; a cut observation is counted once."""
        messages = [{"role": "user", "content": observation}] if isinstance(observation, str) else observation
        budget, kept = self.max_observation_tokens, []
        for message in messages:
            ids, cut = head_ids(self.renderer.encode, message["content"], budget)
            kept.append({**message, "content": self.renderer.decode(ids) if cut else message["content"]})
            budget -= len(ids)
        self.observations_truncated += int(kept != list(messages))
        return kept

    def _truncated(self, text: str) -> str:
        """`text` cut to env.max_observation_tokens tokens; counted when cut."""
        ids, cut = head_ids(self.renderer.encode, text, self.max_observation_tokens)
        if not cut:
            return text
        self.observations_truncated += 1
        return self.renderer.decode(ids)


def head_ids(encode: Callable[[str], list[int]], text: str, budget: int) -> tuple[list[int], bool]:
    """The first `budget` token ids of `text`, and whether it has more. Only a prefix a few times
    `budget` characters long is encoded (a megabyte observation costs what a short one does); the
    prefix is cut well past the last id kept, so the ids are those of the whole text."""
    chars = max(64, 8 * budget)
    while True:
        ids = encode(text[:chars])
        if chars >= len(text) or len(ids) > budget + 16:
            return ids[: max(budget, 0)], len(ids) > budget
        chars *= 4
