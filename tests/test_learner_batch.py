"""TrainBatch: groups to padded tensors, and micro-batches (longest first, count and token limits)."""

import pytest
import torch

from grpo_dist.learner.batch import TrainBatch
from grpo_dist.common.types import Completion, Group


def group(prompt_ids: list[int], completions: list[list[int]], finish_reasons: list[str] | None = None) -> Group:
    reasons = finish_reasons or ["stop"] * len(completions)
    return Group(prompt_index=0, row={}, prompt="", prompt_ids=prompt_ids, policy_version=0,
                 completions=[Completion(ids, [-0.5] * len(ids), "", reason) for ids, reason in zip(completions, reasons)])


# sequence lengths (prompt + completion): 5, 9, 3, 7
BATCH = TrainBatch.from_groups([group([1, 2], [[3, 4, 5], [3, 4, 5, 6, 7, 8, 9]]),
                                group([1], [[2, 3], [2, 3, 4, 5, 6, 7]])], pad_id=0,
                               advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]))


def test_from_groups_pads_right_and_masks_completion_targets():
    assert BATCH.input_ids.shape == (4, 9) and BATCH.lengths.tolist() == [5, 9, 3, 7]
    assert BATCH.input_ids[0].tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 0]
    # position t scores token t+1: the first completion token of row 0 is target 1
    assert BATCH.mask[0].tolist() == [0, 1, 1, 1, 0, 0, 0, 0]
    assert BATCH.sampler_logprobs[0].tolist() == [0, -0.5, -0.5, -0.5, 0, 0, 0, 0]
    assert BATCH.mask[2].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("size,max_tokens,expected", [
    (None, None, [[1, 3, 0, 2]]),
    (2, None, [[1, 3], [0, 2]]),
    (3, None, [[1, 3, 0], [2]]),
    (None, 15, [[1], [3, 0], [2]]),  # 2 x 9 > 15; 2 x 7 <= 15; 3 x 7 > 15
    (None, 4, [[1], [3], [0], [2]]),  # longer than the budget: alone
    (1, 100, [[1], [3], [0], [2]]),
])
def test_micro_batches_come_longest_first_within_both_limits(size, max_tokens, expected):
    parts = BATCH.micro_batches(torch.arange(4), size, max_tokens)
    assert [part.tolist() for part in parts] == expected


def test_micro_batches_of_some_rows_use_only_those():
    assert [p.tolist() for p in BATCH.micro_batches(torch.tensor([2, 0]), 1, None)] == [[0], [2]]


def test_select_cuts_padding_to_the_longest_selected_row():
    part = BATCH.select(torch.tensor([3, 0]))
    assert part.input_ids.shape == (2, 7) and part.mask.shape == (2, 6)
    assert part.advantages.tolist() == [-0.5, 1.0] and part.old_logprobs is None
    assert torch.equal(part.input_ids[1], BATCH.input_ids[0, :7])


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_truncated_completions_leave_the_loss_when_asked(mask_truncated):
    """DAPO's overlong filtering: the completion cut at the length limit gets mask 0 on every token."""
    batch = TrainBatch.from_groups([group([1, 2], [[3, 4, 5], [3, 4, 5]], ["stop", "length"])], pad_id=0,
                                   mask_truncated=mask_truncated)
    assert batch.mask[0].tolist() == [0, 1, 1, 1]
    assert batch.mask[1].tolist() == ([0, 0, 0, 0] if mask_truncated else [0, 1, 1, 1])
    assert batch.input_ids[1].tolist() == [1, 2, 3, 4, 5]  # still in the batch: its reward counts in the group
