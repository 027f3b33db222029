"""Text <-> ids for episodes: the chat template's pieces, rendered without re-tokenizing the model.

`ChatRenderer` knows three things about a template, each read off a rendering:
- `closing`: what it writes after an assistant message's content (ChatML: "<|im_end|>\\n");
  the model's own end-of-turn token is the start of it, the rest is a separator;
- `observation_text(new)`: the text of new messages plus the generation prompt, rendered
  against a fixed base conversation (render [base, *new], take what follows the base's
  rendering), so the template's separators are kept and the history is never re-rendered;
- `render(messages)`: the whole conversation, the reference the prefix check compares with.
`TextRenderer` is the same for a model without a chat template: text is appended as is.
"""

from __future__ import annotations

from typing import Any

from grpo_dist.env.base import EnvError, Message

_MARK = "\u2063CONTENT\u2063"  # an assistant content no reply contains: where the content ends
BASE: list[Message] = [{"role": "user", "content": "base"}, {"role": "assistant", "content": "base"}]


class TemplateError(EnvError):
    """A chat template whose pieces do not add up (not usable with env.history=append)."""


class TextRenderer:
    """No chat template: the opening is a prompt string, observations are text appended as is."""

    chat = False
    closing = ""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)

    def opening_ids(self, prompt: str) -> list[int]:
        """The prompt's ids as data.py tokenizes a prompt without a template (special tokens added)."""
        return list(self.tokenizer(prompt)["input_ids"])


class ChatRenderer(TextRenderer):
    """A tokenizer's chat template, taken apart into the pieces an episode appends."""

    chat = True

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        rendered = self.render([BASE[0], {"role": "assistant", "content": _MARK}], generation_prompt=False)
        if _MARK not in rendered:
            raise TemplateError("the chat template drops the last assistant message's content")
        self.closing = rendered[rendered.rindex(_MARK) + len(_MARK):]
        self.base_text = self.render(BASE, generation_prompt=False)

    def render(self, messages: list[Message], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def opening_ids(self, messages: list[Message]) -> list[int]:  # type: ignore[override]
        """The opening's ids as data.py tokenizes a chat prompt (the template writes BOS itself)."""
        return self.encode(self.render(messages, generation_prompt=True))

    def observation_text(self, new: list[Message]) -> str:
        """The text `new` adds after an assistant turn, the generation prompt included."""
        rendered = self.render([*BASE, *new], generation_prompt=True)
        if not rendered.startswith(self.base_text):
            raise TemplateError("the chat template renders the base conversation differently when messages follow")
        return rendered[len(self.base_text):]
