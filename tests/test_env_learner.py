"""A multi-turn completion's loss mask: the environment's tokens reach neither the loss nor any
statistic of the learner (values computed by hand from a separate forward pass)."""

import math

import pytest
import torch

from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.logprobs import token_logprobs
from grpo_dist.common.types import Completion, Group
from learner_helpers import make_learner


def test_the_batch_mask_is_the_loss_mask_shifted_like_the_completion_mask():
    group = Group(prompt_index=0, row={}, prompt="ab", prompt_ids=[5, 6, 7], policy_version=0, completions=[
        Completion(token_ids=[10, 11, 12, 13, 14], logprobs=[-1.0, -2.0, 0.0, 0.0, -5.0], text="", finish_reason="stop",
                   loss_mask=[1, 1, 0, 0, 1]),
        Completion(token_ids=[20, 21], logprobs=[-1.5, -2.5], text="", finish_reason="length"),
    ])
    batch = TrainBatch.from_groups([group], pad_id=0)
    # position t scores token t+1: the completion's tokens are positions 2.. of the [B, L-1] tensors
    assert batch.mask.tolist() == [[0, 0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 0, 0, 0]]
    assert batch.sampler_logprobs.tolist() == [[0, 0, -1, -2, 0, 0, -5], [0, 0, -1.5, -2.5, 0, 0, 0]]
    masked = TrainBatch.from_groups([group], pad_id=0, mask_truncated=True)
    assert masked.mask.tolist() == [[0, 0, 1, 1, 0, 0, 1], [0] * 7]
    group.completions[0].loss_mask = [1, 1]
    with pytest.raises(ValueError, match="a loss mask of 2 for 5 completion tokens"):
        TrainBatch.from_groups([group], pad_id=0)


def test_a_per_turn_episode_is_one_row_per_turn_each_with_its_episodes_advantage():
    turns = [([5, 6, 10, 11], [0, 0, 1, 1], [0.0, 0.0, -1.0, -2.0]),  # context 5 6, reply 10 11
             ([5, 6, 10, 11, 7, 8, 12], [0, 0, 0, 0, 0, 0, 1], [0.0] * 6 + [-3.0])]  # context re-rendered, reply 12
    group = Group(prompt_index=0, row={}, prompt="", prompt_ids=[5, 6], policy_version=0, completions=[
        Completion(token_ids=[10, 11, 12], logprobs=[-1.0, -2.0, -3.0], text="", finish_reason="stop", turns=turns),
        Completion(token_ids=[20], logprobs=[-0.5], text="", finish_reason="stop"),
    ])
    batch = TrainBatch.from_groups([group], pad_id=0, advantages=torch.tensor([1.5, -1.5]))
    assert batch.input_ids.tolist() == [[5, 6, 10, 11, 0, 0, 0], [5, 6, 10, 11, 7, 8, 12], [5, 6, 20, 0, 0, 0, 0]]
    assert batch.mask.tolist() == [[0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 1, 0, 0, 0, 0]]
    assert batch.sampler_logprobs.tolist() == [[0, -1, -2, 0, 0, 0], [0, 0, 0, 0, 0, -3], [0, -0.5, 0, 0, 0, 0]]
    assert batch.advantages.tolist() == [1.5, 1.5, -1.5]


def test_environment_tokens_reach_no_loss_and_no_statistic():
    learner = make_learner("rollout.group_size=2", "algo.aggregation=token_mean")
    encode = learner.tokenizer.encode
    prompt = encode("12+30=")
    # episode 1: reply "4", observation " no, again:" (the environment's), reply "42"; episode 2: reply "7"
    reply_1, observation, reply_2, other = encode("4"), encode(" no, again:"), encode("42"), encode("7")
    ids_1 = reply_1 + observation + reply_2
    mask_1 = [1] * len(reply_1) + [0] * len(observation) + [1] * len(reply_2)
    sequences = [prompt + ids_1, prompt + other]
    with torch.no_grad():  # the model's logprobs and entropies before the step, by a forward pass of our own
        forward = [token_logprobs(learner.policy, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long), 1.0,
                                  with_entropy=True) for s in sequences]
    positions = [[len(prompt) - 1 + t for t, m in enumerate(mask_1) if m], [len(prompt) - 1]]
    offset = 0.01  # the sampler's logprobs differ from the learner's by this on the model's tokens
    sampler_1 = [forward[0][0][0, len(prompt) - 1 + t].item() + offset if m else -30.0 for t, m in enumerate(mask_1)]
    sampler_2 = [forward[1][0][0, len(prompt) - 1].item() + offset]
    group = Group(prompt_index=0, row={}, prompt="12+30=", prompt_ids=prompt, policy_version=0, rewards=[1.0, 0.0],
                  completions=[Completion(ids_1, sampler_1, "", "stop", loss_mask=mask_1),
                               Completion(other, sampler_2, "", "stop")])
    metrics = learner.train_step([group])
    # token_mean with ratio 1: loss = -sum_i A_i n_i / sum_i n_i over the model's tokens n_i only
    advantage = 1 / math.sqrt(2)  # rewards (1, 0): (r - 0.5) / std, std = sqrt(0.5)
    n_1, n_2 = sum(mask_1), len(other)
    assert metrics["loss/policy"] == pytest.approx(-(advantage * n_1 - advantage * n_2) / (n_1 + n_2), abs=1e-5)
    entropies = [forward[0][1][0, p].item() for p in positions[0]] + [forward[1][1][0, p].item() for p in positions[1]]
    assert metrics["policy/entropy"] == pytest.approx(sum(entropies) / len(entropies), abs=1e-5)
    assert metrics["rollout/logprob_diff_abs_max"] == pytest.approx(offset, abs=1e-4)  # not 30: the -30s are off the mask
    assert metrics["rollout/logprob_diff_abs_mean"] == pytest.approx(offset, abs=1e-4)
    # k3 of KL(sampler || learner), log pi_learner - log pi_sampler = -offset on every token in the loss
    assert metrics["rollout/mismatch_kl"] == pytest.approx(math.exp(-offset) + offset - 1, rel=2e-3)
    assert metrics["policy/ratio_max"] == pytest.approx(1.0, abs=1e-6)
