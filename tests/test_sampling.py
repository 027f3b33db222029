"""rollout/sampling.py: the distribution both engines sample, when they stop, and who gets which seed."""

import pytest
import torch

from grpo_dist.config.schema import load_config
from grpo_dist.rollout.sampling import (
    StopStrings,
    draw,
    regroup,
    requests,
    sampled_logprobs,
    sampling_settings,
    stop_token_ids,
)
from grpo_dist.common.seeding import completion_seed
from grpo_dist.tasks.tiny import EOS_ID, IM_END, build_tokenizer, save_tiny_model
from grpo_dist.common.types import Completion, SamplingSettings

LOGITS = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))  # probabilities 0.5, 0.25, 0.15, 0.1


def probabilities(**settings) -> list[float]:
    return sampled_logprobs(LOGITS, SamplingSettings(n=1, **settings)).exp()[0].tolist()


def test_plain_sampling_is_the_softmax_at_the_temperature():
    assert probabilities() == pytest.approx([0.5, 0.25, 0.15, 0.1])
    # T = 0.5 squares the probabilities before normalising: 0.25, 0.0625, 0.0225, 0.01 over 0.345
    assert probabilities(temperature=0.5) == pytest.approx([0.25 / 0.345, 0.0625 / 0.345, 0.0225 / 0.345,
                                                            0.01 / 0.345])


def test_top_k_then_top_p_renormalise_over_what_they_keep():
    assert probabilities(top_k=2) == pytest.approx([2 / 3, 1 / 3, 0, 0])
    # top_p keeps the most likely tokens until their mass reaches p: 0.5 + 0.25 >= 0.7
    assert probabilities(top_p=0.7) == pytest.approx([2 / 3, 1 / 3, 0, 0])
    assert probabilities(top_p=0.75) == pytest.approx([2 / 3, 1 / 3, 0, 0])
    assert probabilities(top_p=0.76) == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    assert probabilities(top_p=0.1) == pytest.approx([1, 0, 0, 0])  # the top token always stays
    # top-p applies to the top-k distribution: of 2/3, 1/3, p = 0.6 keeps the first only
    assert probabilities(top_k=2, top_p=0.6) == pytest.approx([1, 0, 0, 0])


def test_greedy_reports_the_raw_distribution():
    assert probabilities(temperature=0.0, top_k=1) == pytest.approx([0.5, 0.25, 0.15, 0.1])


def test_draws_follow_the_distribution_and_skip_what_was_cut():
    logprobs = sampled_logprobs(LOGITS.repeat(4000, 1), SamplingSettings(n=1, top_p=0.76))
    tokens = draw(logprobs, [torch.Generator().manual_seed(i) for i in range(4000)])
    counts = torch.bincount(tokens, minlength=4) / 4000
    assert counts[3] == 0
    assert counts[:3].tolist() == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9], abs=0.03)
    assert draw(logprobs[:3], None).tolist() == [0, 0, 0]


def test_a_rows_draw_depends_on_its_generator_alone():
    logprobs = sampled_logprobs(torch.randn(5, 50, generator=torch.Generator().manual_seed(0)), SamplingSettings(n=1))
    alone = [draw(logprobs[i : i + 1], [torch.Generator().manual_seed(100 + i)]).item() for i in range(5)]
    together = draw(logprobs, [torch.Generator().manual_seed(100 + i) for i in range(5)]).tolist()
    assert alone == together


def test_each_completion_gets_its_own_seed_and_greedy_gets_copies():
    sampling = SamplingSettings(n=3)
    rows = requests([[1], [2]], sampling, [10, 20])
    assert rows == [([1], completion_seed(10, 0)), ([1], completion_seed(10, 1)), ([1], completion_seed(10, 2)),
                    ([2], completion_seed(20, 0)), ([2], completion_seed(20, 1)), ([2], completion_seed(20, 2))]
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        requests([[1], [2]], sampling, [10])
    greedy = SamplingSettings(n=3, temperature=0.0)
    assert requests([[1], [2]], greedy, [10, 20]) == [([1], None), ([2], None)]
    groups = regroup([Completion([5], [-0.1], "a", "stop"), Completion([6], [-0.2], "b", "stop")], greedy)
    assert [[c.token_ids for c in g] for g in groups] == [[[5]] * 3, [[6]] * 3]
    groups[0][0].token_ids.append(7)
    assert groups[0][1].token_ids == [5], "copies, not one object three times"


def test_stop_strings_are_found_in_the_completions_tail():
    tokenizer = build_tokenizer()
    stop = StopStrings(tokenizer, ("\n\n", "###"))
    ids = tokenizer("the answer is 7")["input_ids"]
    assert not stop.found(ids)
    assert stop.found(ids + tokenizer("\n\n")["input_ids"])
    assert stop.found(tokenizer("x" * 100 + "##")["input_ids"] + tokenizer("#")["input_ids"])
    assert not StopStrings(tokenizer, ())


def test_stop_ids_are_the_tokenizers_eos_and_the_generation_configs(tmp_path):
    save_tiny_model(tmp_path / "plain", "llama")
    assert stop_token_ids(str(tmp_path / "plain"), build_tokenizer()) == [EOS_ID]
    save_tiny_model(tmp_path / "chat", "llama", chat=True, generation_config={"eos_token_id": [IM_END]})
    chat = build_tokenizer(chat=True)
    assert stop_token_ids(str(tmp_path / "chat"), chat) == sorted([EOS_ID, chat.convert_tokens_to_ids(IM_END)])


def test_settings_come_from_the_rollout_config():
    rollout = load_config(None, ["rollout.temperature=0.7", "rollout.top_p=0.9", "rollout.top_k=20",
                                 "rollout.stop=['</answer>']", "rollout.group_size=4"]).rollout
    assert sampling_settings(rollout) == SamplingSettings(n=4, temperature=0.7, top_p=0.9, top_k=20,
                                                          max_new_tokens=8, stop=("</answer>",))
    greedy = sampling_settings(rollout, greedy=True)
    assert greedy.n == 1 and greedy.temperature == 0.0 and greedy.stop == ("</answer>",)
