"""agent/tool_calls.py: each parser on good, several, malformed and tricky replies, expected values
written by hand. Arguments keep every character (vllm #22885 dropped some): unicode, escaped
quotes, nested braces, newlines inside strings, `</tool_call>` inside a JSON string."""

import pytest

from grpo_dist.agent.tool_calls import PARSERS, ParsedReply, ToolCall, check_pattern, parse_reply


def ids(index: int) -> str:
    return f"call_ep7_{index}"


def calls(*pairs: tuple[str, str]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(ids(k), name, arguments) for k, (name, arguments) in enumerate(pairs))


# A JSON object as a model writes it (escapes, braces and a tag inside strings, compact spacing)
# and its canonical text: json.dumps(obj, ensure_ascii=False), every character of every string kept.
TRICKY = (r'{"text":"h\u00e9llo 世界 🙂","quote":"say \"hi\" {not a brace}","nested":{"a":{"b":[1,{"c":"}"}]}},'
          r'"code":"def f():\n\treturn 1","tag":"</tool_call> <tool_call>","empty":{}}')
TRICKY_CANONICAL = ('{"text": "héllo 世界 🙂", "quote": "say \\"hi\\" {not a brace}", "nested": {"a": {"b": [1, {"c": "}"}]}}, '
                    '"code": "def f():\\n\\treturn 1", "tag": "</tool_call> <tool_call>", "empty": {}}')

HERMES = [
    ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
     ParsedReply("Let me add.", calls(("add", '{"a": 2, "b": 3}')), False)),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
     '<tool_call>{"name":"mul","arguments":{"b":[2, 3]}}</tool_call>',
     ParsedReply(None, calls(("add", '{"a": 1}'), ("mul", '{"b": [2, 3]}')), False)),
    ('First <tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", "arguments": {}}'
     '</tool_call> done.', ParsedReply("First  then  done.", calls(("a", "{}"), ("b", "{}")), False)),
    (f'<tool_call>\n{{"name": "write", "arguments": {TRICKY}}}\n</tool_call>',
     ParsedReply(None, calls(("write", TRICKY_CANONICAL)), False)),
    ('<tool_call>{"arguments": {"x": 1}, "name": "swap"}</tool_call>',  # key order is the model's business
     ParsedReply(None, calls(("swap", '{"x": 1}')), False)),
    ("The answer is 5.\n", ParsedReply("The answer is 5.\n", (), False)),
    ('{"name": "add", "arguments": {"a": 1}}', ParsedReply('{"name": "add", "arguments": {"a": 1}}', (), False)),
]

HERMES_MALFORMED = [
    '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>',  # bad JSON
    '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
    '<tool_call>{"name": "", "arguments": {}}</tool_call>',
    '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>',  # arguments a string, not an object
    '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "add"}</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": {"a": 1}}',  # unclosed
    '<tool_call>{"name": "add", "arguments": {"a": 1}} trailing</tool_call>',
    '<tool_call>["add", {"a": 1}]</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": NaN}}</tool_call>',  # not JSON, though json.loads takes it
    '<tool_call>{"name": "add", "arguments": {"a": "\\ud800"}}</tool_call>',  # a lone surrogate: no UTF-8 for it
    '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}</tool_call>",
    '<tool_call>{"name": "ok", "arguments": {}}</tool_call> <tool_call>{"name": "bad"</tool_call>',  # one bad of two
]


@pytest.mark.parametrize("text,expected", HERMES)
def test_hermes_reads_tool_call_blocks_and_keeps_the_text_between_as_content(text, expected):
    assert parse_reply(text, "hermes", ids) == expected


@pytest.mark.parametrize("parser,text", [("hermes", text) for text in HERMES_MALFORMED] + [
    ("llama3_json", '{"name": "add", "parameters": {"a": 2}} and some text'),
    ("llama3_json", '{"parameters": {"a": 2}}'),
    ("llama3_json", '{"name": "add", "parameters": [2]}'),
    ("llama3_json", '{"name": "add", "parameters": {"a": 2}; {"name": "b"}'),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 2'),
    ("llama3_json", "<|python_tag|>print(2 + 3)"),
    ("regex", '<function=add>{"a": 2,}</function>'),
    ("regex", "<function=add>[2, 3]</function>"),
    ("regex", '<function=add>{"a": 2} extra</function>'),
])
def test_a_malformed_call_returns_the_whole_reply_as_content_without_calls(parser, text):
    assert parse_reply(text, parser, ids, FUNCTION) == ParsedReply(text, (), True)


LLAMA3 = [
    ('{"name": "add", "parameters": {"a": 2, "b": 3}}', ParsedReply(None, calls(("add", '{"a": 2, "b": 3}')), False)),
    ('<|python_tag|>{"name": "add", "arguments": {"a": 2}}\n', ParsedReply(None, calls(("add", '{"a": 2}')), False)),
    ('{"name": "add", "parameters": {"a": 1}}; {"name":"mul","parameters":{"b":2}};',
     ParsedReply(None, calls(("add", '{"a": 1}'), ("mul", '{"b": 2}')), False)),
    (f'  {{"name": "write", "parameters": {TRICKY}}}', ParsedReply(None, calls(("write", TRICKY_CANONICAL)), False)),
    ("The answer is 5.", ParsedReply("The answer is 5.", (), False)),
    ('Call: {"name": "add", "parameters": {}}', ParsedReply('Call: {"name": "add", "parameters": {}}', (), False)),
]


@pytest.mark.parametrize("text,expected", LLAMA3)
def test_llama3_json_reads_a_reply_made_of_json_calls(text, expected):
    assert parse_reply(text, "llama3_json", ids) == expected


FUNCTION = r"<function=(?P<name>\w+)>(?P<arguments>.*?)</function>"


@pytest.mark.parametrize("text,expected", [
    ('Adding. <function=add>{"a": 2, "b": 3}</function>', ParsedReply("Adding.", calls(("add", '{"a": 2, "b": 3}')), False)),
    ('<function=a>{}</function>\n<function=b>{\n  "x": "</function"\n}</function>',
     ParsedReply(None, calls(("a", "{}"), ("b", '{"x": "</function"}')), False)),
    (f"<function=write>{TRICKY}</function>", ParsedReply(None, calls(("write", TRICKY_CANONICAL)), False)),
    ("No call here.", ParsedReply("No call here.", (), False)),
])
def test_regex_reads_each_match_of_the_users_pattern(text, expected):
    assert parse_reply(text, "regex", ids, FUNCTION) == expected


def test_check_pattern_names_what_is_wrong_with_a_pattern():
    assert check_pattern(FUNCTION).groupindex.keys() == {"name", "arguments"}
    with pytest.raises(ValueError, match=r"does not compile: missing \), unterminated subpattern"):
        check_pattern("(?P<name>\\w+")
    with pytest.raises(ValueError, match="has no named group arguments: write"):
        check_pattern(r"<(?P<name>\w+)>(.*)")
    with pytest.raises(ValueError, match="has no named group name or arguments"):
        check_pattern(r"<(\w+)>")


def test_parser_names_are_checked_and_regex_needs_a_pattern():
    assert PARSERS == ("hermes", "llama3_json", "regex")
    with pytest.raises(ValueError, match="unknown tool-call parser 'pythonic': one of hermes, llama3_json, regex"):
        parse_reply("text", "pythonic", ids)
    with pytest.raises(ValueError, match="needs a pattern"):
        parse_reply("text", "regex", ids)


def test_the_config_offers_exactly_the_registered_parsers():
    """agent.tool_parser's choices (what docs/config.md prints) are the parsers tool_calls.py has."""
    from typing import get_args

    from grpo_dist.agent.config import AgentConfig

    assert set(get_args(AgentConfig.model_fields["tool_parser"].annotation)) == set(PARSERS)
