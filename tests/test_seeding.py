"""Per-completion random streams: distinct, reproducible, independent of the batch around them."""

from grpo_dist.common.seeding import completion_seed, prompt_seed, turn_seed


def test_seeds_are_reproducible_and_distinct_across_steps_positions_and_samples():
    assert prompt_seed(0, 3, 5) == prompt_seed(0, 3, 5)
    prompts = {prompt_seed(seed, step, position) for seed in range(3) for step in range(20) for position in range(32)}
    assert len(prompts) == 3 * 20 * 32
    completions = {completion_seed(p, sample) for p in prompts for sample in range(16)}
    assert len(completions) == len(prompts) * 16


def test_a_completions_seed_is_its_prompts_plus_its_index_as_vllm_seeds_a_request_of_n():
    assert [completion_seed(prompt_seed(1, 2, 3), j) for j in range(4)] == [prompt_seed(1, 2, 3) + j for j in range(4)]


def test_every_turn_of_every_episode_of_a_group_has_its_own_stream():
    # episode j + 1's turn t must not reuse episode j's turn t + 1 (an additive turn seed would)
    episodes = [completion_seed(prompt_seed(0, 0, 0), j) for j in range(8)]
    turns = {turn_seed(episode, t) for episode in episodes for t in range(8)}
    assert len(turns) == 64 and not turns & set(episodes)


def test_a_step_never_reuses_the_previous_steps_streams_shifted_by_one():
    # the bug this replaces: call c+1 reused call c's streams shifted by one sample
    step_one = [completion_seed(prompt_seed(0, 1, p), s) for p in range(4) for s in range(8)]
    step_two = [completion_seed(prompt_seed(0, 2, p), s) for p in range(4) for s in range(8)]
    assert not set(step_one) & set(step_two)


def test_seeds_fit_a_torch_generator():
    import torch

    largest = completion_seed((1 << 62) - 1, 2**16)  # the largest prompt seed plus a huge G
    for seed in (prompt_seed(2**40, -1, 10**6), completion_seed(prompt_seed(0, 0, 0), 15), largest):
        assert 0 <= seed < 2**63
        torch.Generator().manual_seed(seed)
