"""The reward_model reward, on a tiny random sequence-classification Llama saved to a temporary folder."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from grpo_dist.config.schema import load_config
from grpo_dist.reward.model import RewardModel
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.tasks.arithmetic import build_tokenizer
from grpo_dist.common.types import Completion, Group

PROMPTS = ["12+34=", "5+5=", "99+1=", "7+80=", "3+3="]
COMPLETIONS = ["<answer>46</answer>", "<answer>1</answer>", "<answer>100</answer>", "8", "<answer>6</answer>"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tokenizers-made character tokenizer and a random 2-layer Llama with one output."""
    path = tmp_path_factory.mktemp("reward_model")
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_one_finite_score_per_sample_and_deterministic(model_dir):
    scores = RewardModel(model_dir, batch_size=2)(PROMPTS, COMPLETIONS)
    assert len(scores) == len(PROMPTS) and all(math.isfinite(s) for s in scores)
    assert len(set(scores)) == len(scores)  # the texts differ, and so do their scores
    assert RewardModel(model_dir, batch_size=2)(PROMPTS, COMPLETIONS) == scores


def test_batching_and_padding_do_not_change_scores(model_dir):
    one_by_one = RewardModel(model_dir, batch_size=1)
    single = [one_by_one([p], [c])[0] for p, c in zip(PROMPTS, COMPLETIONS)]
    batched = RewardModel(model_dir, batch_size=4)(PROMPTS, COMPLETIONS)
    assert batched == pytest.approx(single, abs=1e-5)


def test_long_texts_keep_their_end(model_dir):
    model = RewardModel(model_dir, max_length=12)
    same_end = model(["1+1=", "99999999+1="], ["<answer>1234567</answer>"] * 2)
    assert same_end[0] == pytest.approx(same_end[1], abs=1e-5)


def test_scores_through_the_reward_worker(model_dir):
    config = load_config(None, [
        f"reward.functions=[{{name: reward_model, kwargs: {{path: '{model_dir}', batch_size: 2}}}}]",
        "reward.accuracy_from=reward_model",
    ])
    worker = RewardWorker(config.reward)
    assert worker.pool is None  # nothing to run in scoring processes
    groups = [
        Group(prompt_index=0, row={"prompt": p}, prompt=p, prompt_ids=[], completions=[Completion([], [], c, "stop")], policy_version=0)
        for p, c in zip(PROMPTS, COMPLETIONS)
    ]
    scored, failures = worker.score(groups)
    expected = RewardModel(model_dir)(PROMPTS, COMPLETIONS)
    assert [g.rewards[0] for g in scored] == pytest.approx(expected, abs=1e-5)
    assert failures == {"reward/reward_model/failures": 0.0}
