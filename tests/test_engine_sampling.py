"""Both engines sample exactly the configured distribution, each completion from its own stream.

The checkpoint here is a chat model whose generation_config.json asks for what an instruct
model's does (repetition_penalty, its own temperature, top_k and top_p, <|im_end|> as an
extra EOS): the engines must take the EOS ids from it and nothing else.
"""

import gc
import shutil

import pytest
import torch
from transformers import GenerationConfig

from conftest import ENGINES
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.rollout.sampling import sampled_logprobs
from grpo_dist.tasks.tiny import EOS_ID, IM_END, build_tokenizer, save_tiny_model
from grpo_dist.common.types import SamplingSettings

TOKENIZER = build_tokenizer(chat=True)
IM_END_ID = TOKENIZER.convert_tokens_to_ids(IM_END)
INSTRUCT_DEFAULTS = {"eos_token_id": [IM_END, "<eos>"], "repetition_penalty": 1.5, "temperature": 0.2,
                     "top_k": 2, "top_p": 0.5, "do_sample": True}
PROMPTS = torch.randint(5, len(TOKENIZER), (6, 5), generator=torch.Generator().manual_seed(0)).tolist()
SEEDS = list(range(100, 106))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The instruct-like checkpoint, and the same weights with only the EOS ids in the generation config."""
    instruct, neutral = tmp_path_factory.mktemp("instruct"), tmp_path_factory.mktemp("neutral")
    model = save_tiny_model(instruct, "llama", tied=False, chat=True, initializer_range=0.2,
                            generation_config=INSTRUCT_DEFAULTS)
    with torch.no_grad():  # make <|im_end|> as likely as the model's favourite character
        probs = model(torch.tensor(PROMPTS)).logits.softmax(dim=-1).mean(dim=(0, 1))
        favourite = int(probs[5:].argmax()) + 5
        model.lm_head.weight[IM_END_ID] = model.lm_head.weight[favourite]
    model.save_pretrained(instruct)
    shutil.copytree(instruct, neutral, dirs_exist_ok=True)
    GenerationConfig(eos_token_id=[IM_END_ID, EOS_ID]).save_pretrained(neutral)
    return {"instruct": str(instruct), "neutral": str(neutral), "model": model}


class Engines:
    """One engine at a time (vLLM in process keeps one), rebuilt when a test asks for another checkpoint."""

    def __init__(self, kind: str) -> None:
        self.kind, self.path, self.engine = kind, None, None

    def __call__(self, path: str):
        if path != self.path:
            self.close()
            if self.kind == "vllm":
                from grpo_dist.rollout.vllm_engine import VLLMEngine

                self.engine = VLLMEngine(path, max_model_len=256, cpu_kv_cache_gb=0.25)
            else:
                self.engine = HFEngine(path)
            self.path = path
        return self.engine

    def close(self) -> None:
        self.engine = self.path = None
        gc.collect()


@pytest.fixture(scope="module", params=ENGINES)
def engines(request):
    engines = Engines(request.param)
    yield engines
    engines.close()


def tokens(groups):
    return [[c.token_ids for c in group] for group in groups]


@torch.no_grad()
def largest_logprob_error(model, prompts, groups, sampling) -> float:
    """The largest difference between a completion's logprobs and those of `sampling`'s
    distribution by a forward of the prompt and completion alone (no cache, no padding)."""
    errors = []
    for prompt, group in zip(prompts, groups):
        for completion in group:
            ids = torch.tensor([prompt + completion.token_ids])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
            expected = sampled_logprobs(logits, sampling).gather(-1, ids[0, len(prompt):, None])[:, 0]
            errors.append((expected - torch.tensor(completion.logprobs)).abs().max().item())
    return max(errors)


def test_identical_prompts_get_independent_groups(engines, checkpoints):
    engine = engines(checkpoints["instruct"])
    sampling = SamplingSettings(n=8, max_new_tokens=16)
    first, second = engine.generate([PROMPTS[0], PROMPTS[0]], sampling, [1100, 1200])
    assert tokens([first]) != tokens([second])
    assert len({tuple(c.token_ids) for c in first}) > 1
    # a completion depends on its seed and the weights, not on the rest of the batch
    mixed = engine.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], sampling, [500, 1100, 600])
    assert tokens([mixed[1]]) == tokens([first])


def test_logprobs_are_those_of_the_configured_distribution(engines, checkpoints):
    """Temperature, top_k and top_p as configured; the checkpoint's own (0.2, 2, 0.5, penalty 1.5) unused."""
    engine, model = engines(checkpoints["instruct"]), checkpoints["model"]
    sampling = SamplingSettings(n=4, temperature=0.7, top_p=0.8, top_k=10, max_new_tokens=16)
    groups = engine.generate(PROMPTS, sampling, SEEDS)
    assert largest_logprob_error(model, PROMPTS, groups, sampling) < 1e-4
    assert len({c.token_ids[0] for g in groups for c in g}) > 2, "top_k=2 of the generation config must not apply"


def test_ragged_prompts_sharing_their_prefill_sample_from_their_own_prompt(engines, checkpoints):
    """Prompts of different lengths (left padding), some repeated, G rows each: the transformers
    engine runs each distinct prompt's prefill once and copies it to its rows; every
    completion's logprobs are still its own prompt's, by a forward without cache or padding."""
    engine, model = engines(checkpoints["neutral"]), checkpoints["model"]
    prompts = [PROMPTS[0][:2], PROMPTS[1], PROMPTS[0][:2], PROMPTS[2][:4]]
    sampling = SamplingSettings(n=3, temperature=0.9, max_new_tokens=8)
    groups = engine.generate(prompts, sampling, [100, 200, 300, 400])
    assert largest_logprob_error(model, prompts, groups, sampling) < 1e-4
    assert tokens(groups[:1]) != tokens(groups[2:3])  # the same prompt, other seeds


def test_the_generation_configs_eos_ids_stop_completions(engines, checkpoints):
    engine = engines(checkpoints["instruct"])
    groups = engine.generate(PROMPTS, SamplingSettings(n=4, max_new_tokens=32), SEEDS)
    completions = [c for g in groups for c in g]
    ended = [c for c in completions if c.token_ids[-1] == IM_END_ID]
    assert ended and all(c.finish_reason == "stop" for c in ended)
    assert all(IM_END_ID not in c.token_ids[:-1] and EOS_ID not in c.token_ids[:-1] for c in completions)
    assert all(c.finish_reason == "length" for c in completions if c.token_ids[-1] not in (IM_END_ID, EOS_ID))


def test_a_stop_string_ends_the_completion_at_the_token_completing_it(engines, checkpoints):
    engine = engines(checkpoints["instruct"])
    free = engine.generate(PROMPTS, SamplingSettings(n=2, max_new_tokens=24), SEEDS)
    longest = max((c for g in free for c in g), key=lambda c: len(c.text))
    stop = longest.text[4:6]
    stopped = engine.generate(PROMPTS, SamplingSettings(n=2, max_new_tokens=24, stop=(stop,)), SEEDS)
    for free_group, stopped_group in zip(free, stopped):
        for before, after in zip(free_group, stopped_group):
            ends = [k for k in range(1, len(before.token_ids) + 1)
                    if stop in TOKENIZER.decode(before.token_ids[:k], skip_special_tokens=True)]
            if ends:  # the same stream up to the token that completes the stop string, which stays
                assert after.token_ids == before.token_ids[: ends[0]] and after.finish_reason == "stop"
                assert after.text.endswith(stop) or stop in after.text[-len(stop) - 1 :]
            else:
                assert after.token_ids == before.token_ids and after.finish_reason == before.finish_reason
            assert after.logprobs == pytest.approx(before.logprobs[: len(after.token_ids)], abs=1e-5)
    assert any(after.finish_reason == "stop" and after.token_ids[-1] not in (IM_END_ID, EOS_ID)
               for group in stopped for after in group)


def test_a_repetition_penalty_in_the_generation_config_changes_nothing(engines, checkpoints):
    sampling = SamplingSettings(n=4, temperature=1.0, max_new_tokens=24)
    instruct = tokens(engines(checkpoints["instruct"]).generate(PROMPTS, sampling, SEEDS))
    neutral = tokens(engines(checkpoints["neutral"]).generate(PROMPTS, sampling, SEEDS))
    assert instruct == neutral
