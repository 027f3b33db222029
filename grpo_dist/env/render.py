"""Text <-> ids for episodes: the chat template's pieces, rendered without re-tokenizing the model.

`ChatRenderer` knows three things about a template, each read off a rendering:
- `closing`: what it writes after an assistant message's content (ChatML: "<|im_end|>\\n");
  the model's own end-of-turn token is the start of it, the rest is a separator;
- `observation_text(new)`: the text of new messages plus the generation prompt, rendered
  against a fixed base conversation (render [base, *new], take what follows the base's
  rendering), so the template's separators are kept and the history is never re-rendered;
- `render(messages)`: the whole conversation, the reference the prefix check compares with.
`TextRenderer` is the same for a model without a chat template: text is appended as is.
Tools (OpenAI's schema) go to a template that uses them (its source mentions `tools`); to one
that ignores them (SmolLM2's ChatML) they go as a hermes block in the system message (env/tools.py).
"""

from __future__ import annotations

from typing import Any

from grpo_dist.env.base import EnvError, Message
from grpo_dist.env.tools import renderable, with_tools_block

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

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tokenizer)
        self.tools = tools or None
        self.native_tools = "tools" in _template_source(tokenizer)
        rendered = self.render([BASE[0], {"role": "assistant", "content": _MARK}], generation_prompt=False)
        if _MARK not in rendered:
            raise TemplateError("the chat template drops the last assistant message's content")
        self.closing = rendered[rendered.rindex(_MARK) + len(_MARK):]
        self.base_text = self.render(BASE, generation_prompt=False)

    def render(self, messages: list[Message], generation_prompt: bool) -> str:
        """The template's text of `messages`, with the tools and with tool calls rendered (env/tools.py)."""
        messages = [renderable(message, self.native_tools) for message in messages]
        if self.tools and not self.native_tools:
            messages = with_tools_block(messages, self.tools)
        tools = {"tools": self.tools} if self.tools and self.native_tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **tools)

    def opening_ids(self, messages: list[Message]) -> list[int]:  # type: ignore[override]
        """The opening's ids as data.py tokenizes a chat prompt (the template writes BOS itself)."""
        return self.encode(self.render(messages, generation_prompt=True))

    def observation_text(self, new: list[Message]) -> str:
        """The text `new` adds after an assistant turn, the generation prompt included."""
        rendered = self.render([*BASE, *new], generation_prompt=True)
        if not rendered.startswith(self.base_text):
            raise TemplateError("the chat template renders the base conversation differently when messages follow")
        return rendered[len(self.base_text):]


def _template_source(tokenizer: Any) -> str:
    """The chat template's jinja source (all of a tokenizer's named templates)."""
    template = tokenizer.chat_template
    return "\n".join(template.values()) if isinstance(template, dict) else str(template or "")
