"""Tools and tool calls through the chat template (env/render.py, env/tools.py), and the round trip:
a reply the model wrote with tool calls, parsed (agent/tool_calls.py) and rendered back.

Tokenizer: the real SmolLM2's BPE. Templates: its own ChatML (ignores tools and cannot render
content None: the renderer writes the tools into the system message and the calls as hermes
text) and a Qwen2.5-style one written here (renders tools and tool calls itself). The model's
reply ids are the canonical encoding of its text, the ids an engine most often samples
(tests/test_real_model_episodes.py covers non-canonical ids through the same Trajectory).
"""

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_dist.agent.tool_calls import parse_reply
from grpo_dist.env.render import ChatRenderer
from grpo_dist.env.trajectory import Trajectory
from grpo_dist.common.models import load_tokenizer

# As Qwen2.5's template: tools in the system message after its content, each call a hermes
# block after the content, tool replies as <tool_response> in a user turn.
QWEN_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
TOOLS_BLOCK = (  # written out by hand: Qwen2.5's wording and layout
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": '
    '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>")
USER = {"role": "user", "content": "What is 23+48?"}
CALL = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 23, "b": 48}'}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
TOOL_REPLY = {"role": "tool", "tool_call_id": "call_0", "content": "71"}
HERMES_REPLY = '<tool_call>\n{"name": "add", "arguments": {"a": 23, "b": 48}}\n</tool_call>'


@pytest.fixture(scope="module")
def smollm(real_model):
    return load_tokenizer(str(real_model))


@pytest.fixture(scope="module")
def qwen_style(smollm):
    tokenizer = copy.deepcopy(smollm)
    tokenizer.chat_template = QWEN_STYLE
    return tokenizer


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_tools_go_into_the_system_message_of_a_template_that_ignores_them(smollm):
    renderer = ChatRenderer(smollm, TOOLS)
    assert not renderer.native_tools
    assert renderer.render([USER], generation_prompt=True) == (
        f"<|im_start|>system\n{TOOLS_BLOCK}<|im_end|>\n"
        "<|im_start|>user\nWhat is 23+48?<|im_end|>\n<|im_start|>assistant\n")
    system = {"role": "system", "content": "Be brief."}
    assert renderer.render([system, USER], generation_prompt=False) == (
        f"<|im_start|>system\n{TOOLS_BLOCK}\n\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 23+48?<|im_end|>\n")
    assert ChatRenderer(smollm).render([system, USER], False) == smollm.apply_chat_template([system, USER],
                                                                                          tokenize=False)


def test_a_template_that_uses_tools_renders_them_itself_in_the_same_layout(qwen_style, smollm):
    renderer = ChatRenderer(qwen_style, TOOLS)
    assert renderer.native_tools
    rendered = renderer.render([USER], generation_prompt=True)
    assert rendered == qwen_style.apply_chat_template([USER], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                               f"assistant.\n\n{TOOLS_BLOCK}<|im_end|>\n")


@pytest.mark.parametrize("template,expected", [
    ("smollm", f"<|im_start|>assistant\n{HERMES_REPLY}<|im_end|>\n<|im_start|>tool\n71<|im_end|>\n"),
    ("qwen_style", f"<|im_start|>assistant\n{HERMES_REPLY}<|im_end|>\n"
                   "<|im_start|>user\n<tool_response>\n71\n</tool_response><|im_end|>\n")])
def test_an_assistant_message_with_tool_calls_and_no_content_renders(template, expected, request):
    renderer = ChatRenderer(request.getfixturevalue(template), TOOLS)
    rendered = renderer.render([USER, CALLED, TOOL_REPLY], generation_prompt=False)
    assert rendered.endswith(f"What is 23+48?<|im_end|>\n{expected}")
    with_content = renderer.render([USER, {**CALLED, "content": "Adding."}], generation_prompt=False)
    assert with_content.endswith(f"<|im_start|>assistant\nAdding.\n{HERMES_REPLY}<|im_end|>\n")


def parsed_message(reply_text: str) -> dict:
    """The assistant message an agent gets back for the reply (hermes), as OpenAI writes it."""
    parsed = parse_reply(reply_text, "hermes", lambda index: f"call_{index}")
    assert not parsed.malformed and parsed.tool_calls
    calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
             for call in parsed.tool_calls]
    return {"role": "assistant", "content": parsed.content, "tool_calls": calls}


@pytest.mark.parametrize("template", ["smollm", "qwen_style"])
@pytest.mark.parametrize("reply_text", [HERMES_REPLY, f"Let me use the tool.\n{HERMES_REPLY}\n{HERMES_REPLY}"])
def test_a_hermes_reply_parsed_and_rendered_back_gives_the_models_tokens(template, reply_text, request):
    tokenizer = request.getfixturevalue(template)
    renderer = ChatRenderer(tokenizer, TOOLS)
    prompt_ids = renderer.opening_ids([USER])
    reply_ids = encode(tokenizer, reply_text + "<|im_end|>")  # as the engine returns it: stopped on end of turn
    rendered = renderer.render([USER, parsed_message(reply_text)], generation_prompt=False)
    assert renderer.encode(rendered) == prompt_ids + reply_ids + encode(tokenizer, "\n")


@pytest.mark.parametrize("template", ["smollm", "qwen_style"])
def test_a_reply_that_renders_back_differently_is_trained_on_the_models_own_ids(template, request):
    """Compact JSON, name after arguments: the same call, other text. The rendering of the parsed
    call differs from the model's tokens; the episode keeps the model's ids and text, and the
    prefix check (on the raw text) lets the tool reply follow."""
    tokenizer = request.getfixturevalue(template)
    renderer = ChatRenderer(tokenizer, TOOLS)
    reply_text = '<tool_call>{"arguments":{"b":48,"a":23},"name":"add"}</tool_call>'
    reply_ids = encode(tokenizer, reply_text + "<|im_end|>")
    assert parsed_message(reply_text)["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"b": 48, "a": 23}'}
    rerendered = renderer.render([USER, parsed_message(reply_text)], generation_prompt=False)
    assert reply_text not in rerendered and renderer.encode(rerendered)[-len(reply_ids) - 1:-1] != reply_ids

    episode = Trajectory(renderer, [USER], max_episode_tokens=4096, max_observation_tokens=256)
    start = len(episode.prompt_ids)
    assert episode.add_reply(reply_ids, [-0.5] * len(reply_ids), "stop") == reply_text
    episode.add_observation([TOOL_REPLY])
    sample = episode.samples[0]
    assert not episode.done and sample.ids[start:start + len(reply_ids)] == reply_ids
    assert sample.loss_mask == [0] * start + [1] * len(reply_ids) + [0] * (len(sample.ids) - start - len(reply_ids))
    raw = renderer.render([USER, {"role": "assistant", "content": reply_text}, TOOL_REPLY], generation_prompt=True)
    assert renderer.decode(sample.ids) == raw


# Assigned characters: SmolLM2's byte-level vocabulary has no token for the UTF-8 lead bytes F1 and
# F2 (U+40000-U+BFFFF, planes with nothing assigned), so the model cannot write those at all.
TEXT = st.text(st.characters(exclude_categories=("Cs", "Cn")))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,20}", fullmatch=True)


@pytest.mark.parametrize("template", ["smollm", "qwen_style"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, arguments=st.dictionaries(TEXT, JSON_VALUES, max_size=5))
def test_any_json_object_survives_hermes_rendering_tokens_and_parsing(template, request, name, arguments):
    tokenizer = request.getfixturevalue(template)
    renderer = ChatRenderer(tokenizer, TOOLS)
    call = {"id": "call_0", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
    before = renderer.render([USER], generation_prompt=True)
    rendered = renderer.render([USER, {"role": "assistant", "content": None, "tool_calls": [call]}], False)
    reply_text = rendered[len(before):-len(renderer.closing)]
    reply_text = renderer.decode(renderer.encode(reply_text))  # as the model's tokens read back
    parsed = parse_reply(reply_text, "hermes", lambda index: f"call_{index}")
    assert parsed.tool_calls and parsed.tool_calls[0].name == name
    assert parsed.tool_calls[0].arguments == call["function"]["arguments"]
    assert json.loads(parsed.tool_calls[0].arguments) == arguments
