"""env/trajectory.py: an episode's ids are the engine's reply ids verbatim plus observation ids; for
append-only templates they equal the template's rendering of the final conversation, the loss mask
covers exactly the replies, and a template that rewrites history takes the configured path.

The replies' ids stand in for an engine's output (tests/test_env_runner.py runs a real one); the
reference is always `apply_chat_template` of the messages, tokenized as data.py tokenizes a prompt.
"""

import pytest

from env_helpers import END_OF_TURN, chat_tokenizer
from grpo_dist.env.base import EnvError
from grpo_dist.env.render import ChatRenderer, TextRenderer
from grpo_dist.env.trajectory import HISTORY_REWRITTEN, MAX_EPISODE_TOKENS, Trajectory
from grpo_dist.tasks.tiny import build_tokenizer

OPENING = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
# (reply text, finish reason, observation after it or None at the end)
TURNS = [("I think 5.", "stop", [{"role": "user", "content": "Wrong: 1 test failed."}]),
         ("It is 4, since 2+2=4 and", "length", [{"role": "tool", "content": "ok"}, {"role": "user", "content": "Go"}]),
         ("4", "stop", None)]


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def reference(tokenizer, messages, generation_prompt: bool = False) -> list[int]:
    return encode(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False,
                                                           add_generation_prompt=generation_prompt))


def play(tokenizer, template: str, turns, history: str = "append", **limits) -> tuple[Trajectory, list]:
    """Feed the turns to a Trajectory; returns it and each reply's (ids, logprobs)."""
    settings = {"max_episode_tokens": 4096, "max_observation_tokens": 256, **limits}
    trajectory = Trajectory(ChatRenderer(tokenizer), OPENING, history=history, **settings)
    replies = []
    for k, (text, finish, observation) in enumerate(turns):
        ids = encode(tokenizer, text + (END_OF_TURN[template] if finish == "stop" else ""))
        logprobs = [-0.01 * (k + 1) * (i + 1) for i in range(len(ids))]
        replies.append((ids, logprobs))
        said = trajectory.add_reply(ids, logprobs, finish)
        assert said == text or trajectory.stop_reason == MAX_EPISODE_TOKENS and text.startswith(said)
        if observation is None or trajectory.done:
            break
        trajectory.add_observation(observation)
        if trajectory.done:
            break
    return trajectory, replies


def final_messages(turns) -> list[dict]:
    messages = list(OPENING)
    for text, _, observation in turns:
        messages.append({"role": "assistant", "content": text})
        messages += observation or []
    return messages


@pytest.mark.parametrize("template,separator", [("chatml", "\n"), ("llama3", ""), ("stripping", "\n")])
def test_append_only_templates_give_the_templates_own_ids_and_mask_exactly_the_replies(template, separator):
    tokenizer = chat_tokenizer(template)  # the stripping template only strips <think>: none here
    trajectory, replies = play(tokenizer, template, TURNS)
    assert trajectory.stop_reason is None and len(trajectory.samples) == 1
    sample = trajectory.samples[0]
    whole = reference(tokenizer, final_messages(TURNS))
    # the template writes the last reply's end-of-turn separator after it; the episode ends before it
    assert sample.ids + encode(tokenizer, separator) == whole
    assert sample.prompt_len == len(reference(tokenizer, OPENING, generation_prompt=True))
    # the mask, hand-derived from the template: reply k starts where the rendering of the
    # conversation up to it, with the generation prompt, ends
    expected_mask = [0] * len(sample.ids)
    expected_logprobs = [0.0] * len(sample.ids)
    for k, (ids, logprobs) in enumerate(replies):
        start = len(reference(tokenizer, final_messages(TURNS[:k]), generation_prompt=True))
        assert sample.ids[start : start + len(ids)] == ids
        expected_mask[start : start + len(ids)] = [1] * len(ids)
        expected_logprobs[start : start + len(ids)] = logprobs
    assert sample.loss_mask == expected_mask
    assert sample.logprobs == expected_logprobs
    assert sum(sample.loss_mask) == sum(len(ids) for ids, _ in replies)
    assert trajectory.messages == final_messages(TURNS)


def test_the_truncated_reply_gets_the_whole_closing_with_mask_0():
    tokenizer = chat_tokenizer("chatml")
    trajectory, replies = play(tokenizer, "chatml", TURNS[:2])
    sample = trajectory.samples[0]
    # after the cut reply: "<|im_end|>\n" then the tool and user messages, all mask 0
    tail = "<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n"
    assert sample.ids[-len(encode(tokenizer, tail)):] == encode(tokenizer, tail)
    assert sample.loss_mask[-len(encode(tokenizer, tail)):] == [0] * len(encode(tokenizer, tail))
    assert trajectory.messages == final_messages(TURNS[:2])
    tail_len = len(encode(tokenizer, tail))
    assert sample.ids[-tail_len - len(replies[1][0]) : -tail_len] == replies[1][0]


def test_a_template_that_strips_earlier_reasoning_ends_the_episode_with_append():
    tokenizer = chat_tokenizer("stripping")
    turns = [("<think>2+2 is 4</think>4", "stop", [{"role": "user", "content": "Sure?"}]), ("4", "stop", None)]
    trajectory, replies = play(tokenizer, "stripping", turns)
    assert trajectory.stop_reason == HISTORY_REWRITTEN
    sample = trajectory.samples[0]
    # nothing appended after the reply the engine saw: the tokens are the ones it saw
    assert sample.ids == reference(tokenizer, OPENING, generation_prompt=True) + replies[0][0]
    assert sample.loss_mask == [0] * sample.prompt_len + [1] * len(replies[0][0])


def test_a_template_that_strips_earlier_reasoning_splits_into_one_sample_per_turn():
    tokenizer = chat_tokenizer("stripping")
    turns = [("<think>2+2 is 4</think>4", "stop", [{"role": "user", "content": "Sure?"}]),
             ("<think>yes</think>4", "stop", None)]
    trajectory, replies = play(tokenizer, "stripping", turns, history="per_turn")
    assert trajectory.stop_reason is None and len(trajectory.samples) == 2
    for k, (sample, (ids, logprobs)) in enumerate(zip(trajectory.samples, replies)):
        context = reference(tokenizer, final_messages(turns)[: len(OPENING) + 2 * k], generation_prompt=True)
        assert sample.ids == context + ids  # the fresh rendering: the first turn's reasoning stripped
        assert sample.prompt_len == len(context)
        assert sample.loss_mask == [0] * len(context) + [1] * len(ids)
        assert sample.logprobs == [0.0] * len(context) + logprobs
    assert "2+2 is 4" not in tokenizer.decode(trajectory.samples[1].ids)


def test_long_observations_are_cut_and_counted():
    tokenizer = chat_tokenizer("chatml")
    turns = [("5", "stop", [{"role": "user", "content": "abcdefgh"}, {"role": "tool", "content": "xyz"}]),
             ("4", "stop", [{"role": "user", "content": "abc"}]), ("4", "stop", None)]
    trajectory, _ = play(tokenizer, "chatml", turns, max_observation_tokens=6)
    assert trajectory.observations_truncated == 1
    cut = [{"role": "user", "content": "abcdef"}, {"role": "tool", "content": ""}]
    expected = final_messages([turns[0][:2] + (cut,), *turns[1:]])
    assert trajectory.messages == expected
    assert trajectory.samples[0].ids + encode(tokenizer, "\n") == reference(tokenizer, expected)


def test_max_episode_tokens_cuts_a_reply_or_refuses_an_observation():
    tokenizer = chat_tokenizer("chatml")
    opening = len(reference(tokenizer, OPENING, generation_prompt=True))
    trajectory, replies = play(tokenizer, "chatml", TURNS, max_episode_tokens=opening + 4)
    assert trajectory.stop_reason == MAX_EPISODE_TOKENS
    assert trajectory.samples[0].ids == reference(tokenizer, OPENING, generation_prompt=True) + replies[0][0][:4]
    assert trajectory.samples[0].logprobs[opening:] == replies[0][1][:4]
    first_reply = len(encode(tokenizer, TURNS[0][0] + "<|im_end|>"))
    trajectory, _ = play(tokenizer, "chatml", TURNS, max_episode_tokens=opening + first_reply + 10)
    assert trajectory.stop_reason == MAX_EPISODE_TOKENS  # the observation does not fit
    assert len(trajectory.samples[0].ids) == opening + first_reply
    assert sum(trajectory.samples[0].loss_mask) == first_reply


def test_without_a_chat_template_text_is_appended_as_is():
    tokenizer = build_tokenizer()
    trajectory = Trajectory(TextRenderer(tokenizer), "1+2=", max_episode_tokens=100, max_observation_tokens=4)
    reply = encode(tokenizer, "4") + [tokenizer.eos_token_id]
    assert trajectory.add_reply(reply, [-0.5, -0.25], "stop") == "4"
    trajectory.add_observation(" no! again:")
    sample = trajectory.samples[0]
    assert sample.ids == list(tokenizer("1+2=")["input_ids"]) + reply + encode(tokenizer, " no!")
    assert sample.loss_mask == [0] * 4 + [1, 1] + [0] * 4 and trajectory.observations_truncated == 1
    with pytest.raises(EnvError, match="no chat template"):
        Trajectory(TextRenderer(tokenizer), [{"role": "user", "content": "hi"}], max_episode_tokens=100,
                   max_observation_tokens=4)
