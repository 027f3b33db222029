"""Token fidelity of agent episodes with the real SmolLM2 tokenizer and chat template: the trained ids
are the engine's ids turn by turn (never the reply's text tokenized again), the engine saw exactly
the episode's ids, and the agent's tool and user messages carry loss mask 0."""

from agent_helpers import Scripted, mask_runs
from grpo_dist.agent.config import AgentConfig
from grpo_dist.common.models import load_tokenizer
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings

ROW = {"prompt": "What is 23+48?"}
AFTER_TURN_1 = "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n"


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def two_turn_episode(agent_runner, engine, tokenizer, max_new_tokens: int):
    runner = agent_runner(engine, tokenizer, AgentConfig(name="agent_helpers:two_turns", max_episode_tokens=400))
    (episode,), = runner.run([ROW], SamplingSettings(n=1, temperature=1.0, max_new_tokens=max_new_tokens),
                             [prompt_seed(0, 0, 0)])
    assert episode.error is None and episode.turns == 2
    return episode


def test_a_reply_is_trained_as_the_engines_ids_never_its_text_tokenized_again(real_model, agent_runner):
    tokenizer = load_tokenizer(str(real_model))
    text = "Hello world, the answer is 42."
    by_character = [i for c in text for i in encode(tokenizer, c)]  # ids BPE would never give this text
    assert encode(tokenizer, tokenizer.decode(by_character)) != by_character  # re-tokenizing would change them
    end = encode(tokenizer, "<|im_end|>")
    engine = Scripted([by_character + end, encode(tokenizer, "Again: 65") + end])
    episode = two_turn_episode(agent_runner, engine, tokenizer, max_new_tokens=64)
    (sample,) = episode.samples()
    assert mask_runs(sample.ids, sample.loss_mask, 1) == [by_character + end, encode(tokenizer, "Again: 65") + end]
    opening, between = mask_runs(sample.ids, sample.loss_mask, 0)
    assert tokenizer.decode(between) == AFTER_TURN_1  # the tool and user messages: mask 0
    assert engine.inputs == [[opening], [opening + by_character + end + between]]  # what the engine saw
    assert episode.infos[0]["seen"][0] == [tokenizer.decode([i]) for i in by_character + end]


def test_per_turn_history_renders_each_context_afresh(real_model, agent_runner):
    tokenizer = load_tokenizer(str(real_model))
    end = encode(tokenizer, "<|im_end|>")
    engine = Scripted([encode(tokenizer, "12") + end, encode(tokenizer, "65") + end])
    runner = agent_runner(engine, tokenizer, AgentConfig(name="agent_helpers:two_turns", history="per_turn"))
    (episode,), = runner.run([ROW], SamplingSettings(n=1, max_new_tokens=8), [prompt_seed(0, 0, 0)])
    first, second = episode.samples()
    assert second.ids[: second.prompt_len] == engine.inputs[1][0]
    assert tokenizer.decode(second.ids[: second.prompt_len]).endswith(AFTER_TURN_1)


def test_a_tool_call_and_its_result_through_the_calculator_agent(real_model, agent_runner):
    """The example agent offers a calculator; the model's hermes call comes back parsed, the agent's
    tool message is appended with mask 0, and the trained ids are still the engine's."""
    tokenizer = load_tokenizer(str(real_model))
    end = encode(tokenizer, "<|im_end|>")
    call = encode(tokenizer, '<tool_call>\n{"name": "calculator", "arguments": {"expression": "23+48"}}\n</tool_call>')
    engine = Scripted([call + end, encode(tokenizer, "It is 71.") + end])
    runner = agent_runner(engine, tokenizer, AgentConfig(name="grpo_dist.agent.examples:calculator"))
    (episode,), = runner.run([{**ROW, "answer": "71"}], SamplingSettings(n=1, max_new_tokens=64), [prompt_seed(0, 0, 0)])
    assert (episode.error, episode.step_rewards, episode.infos) == (None, [1.0], [{"tool_calls": 1}])
    (sample,) = episode.samples()
    assert mask_runs(sample.ids, sample.loss_mask, 1) == [call + end, encode(tokenizer, "It is 71.") + end]
    opening, between = mask_runs(sample.ids, sample.loss_mask, 0)
    assert '"name": "calculator"' in tokenizer.decode(opening)  # the tools, in the system message
    assert tokenizer.decode(between) == "\n<|im_start|>tool\n71<|im_end|>\n<|im_start|>assistant\n"
