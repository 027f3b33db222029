"""Single-turn chat prompts on a real model (SmolLM2-135M-Instruct, the `real_model` fixture):
its own BPE tokenizer and ChatML template, and eos = pad = <|im_end|> (id 2).

data.py's rendered prompt ids are compared with the tokenizer's own `apply_chat_template`, and
the training batch's mask with one built by hand from the engine's completion lengths.
"""

import gc

import pytest
import torch

from conftest import ENGINES
from grpo_dist.config.schema import DataConfig
from grpo_dist.tasks.data import build_prompts
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.common.models import load_tokenizer
from grpo_dist.common.types import Group, SamplingSettings

IM_END_ID = 2
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Greedy replies that end within a few tokens (measured: "7 + 5 = 12.", "Paris").
QUESTIONS = ["What is 7+5? Answer with the number only.", "What is the capital of France? One word."]


@pytest.fixture(scope="module")
def tokenizer(real_model):
    return load_tokenizer(str(real_model))


def template_ids(tokenizer, messages) -> list[int]:
    """The reference: the tokenizer's own chat template, tokenized by the tokenizer."""
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])


def test_the_real_model_is_what_the_tests_assume(real_model, tokenizer):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(real_model)
    assert (config.tie_word_embeddings, config.num_attention_heads, config.num_key_value_heads) == (True, 9, 3)
    assert config.vocab_size == len(tokenizer) == 49152
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == IM_END_ID


def test_chat_prompts_are_the_templates_ids_with_its_default_system_message(tokenizer):
    rows = [{"prompt": q} for q in QUESTIONS] + [{"prompt": [{"role": "system", "content": "Be terse."},
                                                              {"role": "user", "content": "Hi"}]}]
    prompts = build_prompts(rows, DataConfig(chat_template="true"), tokenizer)
    for row, prompt in zip(rows, prompts):
        messages = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        assert prompt.ids == template_ids(tokenizer, messages)
    # ChatML writes its default system message when the conversation has none, and only then
    assert tokenizer.decode(prompts[0].ids).startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
    assert DEFAULT_SYSTEM not in tokenizer.decode(prompts[2].ids)
    assert tokenizer.decode(prompts[0].ids).endswith(f"{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n")
    # data.system_prompt takes the default's place
    own = build_prompts(rows[:1], DataConfig(chat_template="true", system_prompt="Be terse."), tokenizer)[0]
    assert own.ids == template_ids(tokenizer, [{"role": "system", "content": "Be terse."},
                                               {"role": "user", "content": QUESTIONS[0]}])


@pytest.fixture(params=ENGINES)
def engine(request, real_model):
    """One engine at a time (vLLM in process holds one); one torch thread, as rollout.threads=1 gives
    a worker: on a busy 2-core machine two threads made one short generation 10-20 times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if request.param == "vllm":
        from grpo_dist.rollout.vllm_engine import VLLMEngine

        made = VLLMEngine(str(real_model), max_model_len=256, cpu_kv_cache_gb=0.25)
    else:
        from grpo_dist.rollout.hf_engine import HFEngine

        made = HFEngine(str(real_model))
    yield made
    del made
    gc.collect()
    torch.set_num_threads(threads)


def test_generation_stops_at_im_end_which_trains_while_the_padding_after_it_does_not(engine, tokenizer):
    prompts = build_prompts([{"prompt": q} for q in QUESTIONS], DataConfig(chat_template="true"), tokenizer)
    sampling = SamplingSettings(n=1, temperature=0.0, max_new_tokens=24)
    outputs = engine.generate([p.ids for p in prompts], sampling, seeds=[0, 1])
    completions = [group[0] for group in outputs]
    for completion in completions:
        assert completion.finish_reason == "stop", completion
        assert completion.token_ids[-1] == IM_END_ID and IM_END_ID not in completion.token_ids[:-1]
        assert "<|im_end|>" not in completion.text and completion.text.strip()
    assert len({len(p.ids) + len(c.token_ids) for p, c in zip(prompts, completions)}) == 2, "no row is padded"
    groups = [Group(p.index, p.row, p.text, p.ids, [c], policy_version=0) for p, c in zip(prompts, completions)]
    batch = TrainBatch.from_groups(groups, pad_id=tokenizer.pad_token_id)
    width = batch.input_ids.shape[1]
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        end = len(prompt.ids) + len(completion.token_ids)  # the sequence's length, its eos included
        assert batch.input_ids[row, :end].tolist() == prompt.ids + completion.token_ids
        assert batch.input_ids[row, end:].tolist() == [IM_END_ID] * (width - end)  # pad = eos
        # position t scores token t+1: the completion's tokens, the final eos among them, are 1
        expected = [0.0] * (len(prompt.ids) - 1) + [1.0] * len(completion.token_ids) + [0.0] * (width - end)
        assert batch.mask[row].tolist() == expected
        assert batch.attention_mask[row].tolist() == [1] * end + [0] * (width - end)
        assert batch.mask[row, end - 2] == 1 and batch.input_ids[row, end - 1] == IM_END_ID
