"""Multi-turn episodes (env/trajectory.py, env/render.py) on a real BPE tokenizer: SmolLM2's.

A character-level tokenizer re-tokenizes any text to the ids it came from, so it cannot tell
an episode that keeps the engine's ids from one that re-encodes the replies' text. Here the
replies are sampled-looking ids that are NOT the canonical encoding of their text (a word
split into two tokens where one token exists), and the reference is built independently:
the template's rendering of the final conversation, encoded piece by piece around the
replies' ids. Templates: the model's own ChatML (a default system message) and a
Llama-3.1-style one written here (a system header with dates, on every conversation).
"""

import copy

import pytest

from env_helpers import STRIPPING
from grpo_dist.env.render import ChatRenderer
from grpo_dist.env.trajectory import HISTORY_REWRITTEN, TEMPLATE_MISMATCH, Trajectory
from grpo_dist.common.models import load_tokenizer

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
LLAMA31_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# As Llama 3.1's template: a system header with the knowledge cut-off and today's date on
# every conversation, the system message (if any) under it, contents trimmed.
LLAMA31 = (
    "{{- '<|begin_of_text|>' }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\n' }}{{- 'Today Date: ' + date_string + '\n\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
OPENING = [{"role": "user", "content": "Greet me twice."}]
OBSERVATION = [{"role": "user", "content": "Again, louder."}]


@pytest.fixture(scope="module")
def chatml(real_model):
    return load_tokenizer(str(real_model))


@pytest.fixture(scope="module")
def llama31(chatml):
    """The real BPE with Llama 3's special tokens added and the Llama-3.1-style template."""
    tokenizer = copy.deepcopy(chatml)
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA31_TOKENS})
    tokenizer.chat_template = LLAMA31
    return tokenizer


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def split_word(tokenizer, word: str) -> list[int]:
    """Two tokens that spell `word`, which the tokenizer itself encodes as one."""
    assert len(encode(tokenizer, word)) == 1
    for cut in range(1, len(word)):
        left, right = encode(tokenizer, word[:cut]), encode(tokenizer, word[cut:])
        if len(left) == len(right) == 1:
            return left + right
    raise AssertionError(f"no two-token spelling of {word!r}")


def reply(tokenizer, end_of_turn: str, *pieces: str) -> list[int]:
    """Reply ids an engine may sample: plain text pieces, and " hello" as two tokens; then end of turn."""
    ids = []
    for piece in pieces:
        ids += split_word(tokenizer, piece) if piece == " hello" else encode(tokenizer, piece)
    return ids + encode(tokenizer, end_of_turn)


def reference(tokenizer, messages, replies: list[list[int]]) -> list[int]:
    """The template's rendering of `messages`, encoded around the replies' content ids, kept as given."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids, start = [], 0
    for content_ids in replies:
        content = tokenizer.decode(content_ids)
        at = text.index(content, start)
        ids += encode(tokenizer, text[start:at]) + content_ids
        start = at + len(content)
    return ids + encode(tokenizer, text[start:])


@pytest.mark.parametrize("template,end_of_turn,separator,header", [
    ("chatml", "<|im_end|>", "\n", DEFAULT_SYSTEM), ("llama31", "<|eot_id|>", "", "Today Date: 26 Jul 2024")])
def test_an_episode_keeps_the_engines_non_canonical_ids_and_the_templates_pieces(
        template, end_of_turn, separator, header, request):
    tokenizer = request.getfixturevalue(template)
    replies = [reply(tokenizer, end_of_turn, "Sure,", " hello", " there."),
               reply(tokenizer, end_of_turn, "HELLO,", " hello", "!")]
    for ids in replies:  # what an engine may sample is not what its text encodes to
        assert encode(tokenizer, tokenizer.decode(ids)) != ids
    trajectory = Trajectory(ChatRenderer(tokenizer), OPENING, max_episode_tokens=4096, max_observation_tokens=256)
    logprobs = [[-0.1 * (k + 1)] * len(ids) for k, ids in enumerate(replies)]
    assert trajectory.add_reply(replies[0], logprobs[0], "stop") == "Sure, hello there."
    trajectory.add_observation(OBSERVATION)
    assert trajectory.add_reply(replies[1], logprobs[1], "stop") == "HELLO, hello!"
    assert trajectory.stop_reason is None
    contents = [ids[:-1] for ids in replies]  # the end-of-turn token is the template's, not the content
    messages = [*OPENING, {"role": "assistant", "content": "Sure, hello there."}, *OBSERVATION,
                {"role": "assistant", "content": "HELLO, hello!"}]
    assert trajectory.messages == messages
    sample = trajectory.samples[0]
    whole = reference(tokenizer, messages, contents)
    # the episode ends with the last reply's end of turn: the template's separator after it is not sampled
    assert sample.ids + encode(tokenizer, separator) == whole
    assert tokenizer.decode(sample.ids) + separator == tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(sample.ids).count(header) == 1  # the opening's header, never an observation's
    # the loss mask and the sampler's logprobs are on the replies' ids, end of turn included, and nowhere else
    mask, expected_logprobs, start = [0] * len(sample.ids), [0.0] * len(sample.ids), 0
    for ids, lps in zip(replies, logprobs):
        at = next(i for i in range(start, len(sample.ids)) if sample.ids[i : i + len(ids)] == ids)
        mask[at : at + len(ids)], expected_logprobs[at : at + len(ids)], start = [1] * len(ids), lps, at + len(ids)
    assert sample.loss_mask == mask and sample.logprobs == expected_logprobs
    assert sample.prompt_len == len(encode(tokenizer, tokenizer.apply_chat_template(
        OPENING, tokenize=False, add_generation_prompt=True)))


def test_observations_rendered_against_the_base_keep_separators_and_write_no_second_system_message(chatml,
                                                                                                     llama31):
    chatml_text = ChatRenderer(chatml).observation_text(OBSERVATION)
    assert chatml_text == "<|im_start|>user\nAgain, louder.<|im_end|>\n<|im_start|>assistant\n"
    llama_text = ChatRenderer(llama31).observation_text(OBSERVATION)
    assert llama_text == ("<|start_header_id|>user<|end_header_id|>\n\nAgain, louder.<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # the default system message and the date header are the opening's, written once
    trajectory = Trajectory(ChatRenderer(chatml), OPENING, max_episode_tokens=4096, max_observation_tokens=256)
    trajectory.add_reply(reply(chatml, "<|im_end|>", "Hi."), [0.0] * 3, "stop")
    trajectory.add_observation(OBSERVATION)
    assert chatml.decode(trajectory.samples[0].ids).count(DEFAULT_SYSTEM) == 1


def test_a_template_that_rewrites_history_fails_the_prefix_check(chatml):
    tokenizer = copy.deepcopy(chatml)
    tokenizer.chat_template = STRIPPING  # ChatML that drops earlier turns' reasoning, as Qwen3's does
    trajectory = Trajectory(ChatRenderer(tokenizer), OPENING, max_episode_tokens=4096, max_observation_tokens=256)
    ids = reply(tokenizer, "<|im_end|>", "<think>Say it.</think>", " hello")
    trajectory.add_reply(ids, [0.0] * len(ids), "stop")
    trajectory.add_observation(OBSERVATION)
    assert trajectory.stop_reason == HISTORY_REWRITTEN
    assert trajectory.samples[0].ids[-len(ids):] == ids  # what the engine did see, nothing appended


def test_a_template_whose_observation_depends_on_the_history_is_a_template_mismatch(chatml):
    tokenizer = copy.deepcopy(chatml)
    # the real ChatML with the message's position in the user header: the base conversation
    # (user, assistant) numbers the next user message 3, a conversation with a system message 4
    header = "'<|im_start|>' + message['role'] + '\n'"
    assert header in chatml.chat_template
    tokenizer.chat_template = chatml.chat_template.replace(
        header, "'<|im_start|>' + message['role'] + (' ' ~ loop.index if message['role'] == 'user' else '') + '\n'")
    opening = [{"role": "system", "content": "Be brief."}, *OPENING]
    trajectory = Trajectory(ChatRenderer(tokenizer), opening, max_episode_tokens=4096, max_observation_tokens=256)
    ids = reply(tokenizer, "<|im_end|>", "Hi.")
    trajectory.add_reply(ids, [0.0] * len(ids), "stop")
    before = list(trajectory.samples[0].ids)
    trajectory.add_observation(OBSERVATION)
    assert trajectory.stop_reason == TEMPLATE_MISMATCH
    assert trajectory.samples[0].ids == before
