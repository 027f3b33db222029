"""Overlap inside a sync step: the learner takes scored chunks one by one (learn_chunk) and steps
once after the last (finish_step), giving train_step's update; the controller feeds it in sync
mode (controller/overlap.py). Groups come from a real transformers engine; rewards are non-binary."""

import pytest
import torch

from learner_helpers import make_config, make_learner, masters, scored_groups

CLOCK = ("system/", "time/")  # rates and seconds


def overlapped(learner, chunks, keys=None):
    keys = keys or [f"chunk {index}" for index in range(len(chunks))]
    for chunk, key in zip(chunks, keys):
        learner.learn_chunk(chunk, key)
    return learner.finish_step(*chunks, keys=[f"chunk {index}" for index in range(len(chunks))])


def assert_same_step(common, chunks, atol=1e-6):
    """Two steps each way (the second on the weights and generator the first left): same masters
    within atol, same metrics within float tolerance."""
    whole, chunked = make_learner(*common, sgd=True), make_learner(*common, sgd=True)
    for _ in range(2):
        expected = whole.train_step(*chunks)
        got = overlapped(chunked, chunks)
        assert got.pop("policy/overlap_fallback") == 0.0
        for mine, theirs in zip(masters(chunked), masters(whole)):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=atol)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            if not key.startswith(CLOCK):
                assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key  # logprobs: float noise of the padding
    assert chunked.version == whole.version == 2


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_the_overlapped_step_is_the_unpipelined_step(aggregation):
    """Three chunks of 1, 2 and 1 groups (different token counts), beta > 0, temperature 0.7."""
    common = [f"algo.aggregation={aggregation}", "algo.beta=0.1", "rollout.temperature=0.7",
              "rollout.max_new_tokens=12"]
    groups = scored_groups(make_config(*common))
    chunks = [groups[:1], groups[1:3], groups[3:]]
    assert len({sum(len(c.token_ids) for g in chunk for c in g.completions) for chunk in chunks}) == 3
    assert_same_step(common, chunks)


def test_several_optimizer_steps_overlap_only_the_no_grad_passes():
    """mu 2 and two minibatches: pi_ref and pi_old per chunk, the updates after the last."""
    common = ["algo.beta=0.1", "rollout.temperature=0.7", "algo.mu=2", "algo.minibatch_size=8",
              "learner.micro_batch_size=3"]
    groups = scored_groups(make_config(*common))
    assert_same_step(common, [groups[:2], groups[2:]])


def test_chunks_that_were_sent_again_fall_back_to_train_step():
    """A chunk generated again has another key: the learner drops what it took and trains anew."""
    groups = scored_groups(make_config())
    chunks = [groups[:2], groups[2:]]
    whole, chunked = make_learner(sgd=True), make_learner(sgd=True)
    expected = whole.train_step(*chunks)
    chunked.learn_chunk(groups[2:], "chunk 0, first attempt (wrongly sampled)")
    chunked.learn_chunk(chunks[1], "chunk 1")
    got = chunked.finish_step(*chunks, keys=["chunk 0", "chunk 1"])
    assert got.pop("policy/overlap_fallback") == 1.0
    assert got["loss/total"] == expected["loss/total"] and chunked.checksum() == whole.checksum()
    assert chunked.chunked is None  # the next step starts afresh
