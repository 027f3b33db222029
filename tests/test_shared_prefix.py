"""learner/logprobs.py's shared prompts against the plain forward, on a real tiny Llama and Qwen2:
the same logprobs, entropies and gradients (up to float rounding), for prompts of different
lengths, completions of different lengths, temperature != 1 and bfloat16; the rule that
decides when sharing pays; and a whole learner step with and without it (beta > 0, mu 1 and 2)."""

import pytest
import torch

from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.logprobs import shares_enough, shared_prefix_logprobs, token_logprobs
from grpo_dist.common.models import load_causal_lm
from grpo_dist.tasks.tiny import save_tiny_model
from grpo_dist.common.types import Completion, Group
from learner_helpers import make_config, make_learner, masters, scored_groups


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_tiny_model(folder, request.param, max_positions=64)
    torch.manual_seed(0)
    return load_causal_lm(str(folder), "float32", "cpu")


def groups(seed: int = 0) -> list[Group]:
    """Three prompts of 1, 5 and 9 ids, each with G=4 completions of 1 to 7 ids."""
    generator = torch.Generator().manual_seed(seed)

    def ids(length: int) -> list[int]:
        return torch.randint(3, 40, (length,), generator=generator).tolist()

    made = []
    for prompt_length in (1, 5, 9):
        completions = []
        for j in range(4):
            tokens = ids(1 + (prompt_length + 2 * j) % 7)
            completions.append(Completion(token_ids=tokens, logprobs=[0.0] * len(tokens), text="", finish_reason="stop"))
        made.append(Group(prompt_index=len(made), row={}, prompt="", prompt_ids=ids(prompt_length),
                          completions=completions, policy_version=0, rewards=[0.0] * 4))
    return made


def gradients(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompts_give_the_plain_forwards_logprobs_entropies_and_gradient(model, temperature):
    batch = TrainBatch.from_groups(groups(), pad_id=0)
    assert batch.prefix_lengths.tolist() == [1] * 4 + [5] * 4 + [9] * 4
    weights = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.mask
    model.zero_grad()
    plain, plain_entropy = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature, with_entropy=True)
    (plain * weights).sum().backward()
    plain_grads = gradients(model)
    shared, shared_entropy = shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask,
                                                    batch.prefix_lengths, temperature, with_entropy=True)
    (shared * weights).sum().backward()
    shared_grads = gradients(model)
    completion = batch.mask.bool()
    assert completion.sum() == sum(len(c.token_ids) for g in groups() for c in g.completions)
    torch.testing.assert_close(shared[completion], plain[completion], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(shared_entropy[completion], plain_entropy[completion], atol=2e-5, rtol=1e-5)
    assert (shared[~completion] == 0).all()  # prompt and padding positions score nothing
    for got, expected in zip(shared_grads, plain_grads):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert max(g.abs().max() for g in plain_grads) > 1e-3  # a gradient that is there to compare


def test_shared_prompts_in_bfloat16_stay_within_its_rounding(model):
    batch = TrainBatch.from_groups(groups(2), pad_id=0)
    bf16 = model.to(torch.bfloat16)
    try:
        with torch.no_grad():
            plain, _ = token_logprobs(bf16, batch.input_ids, batch.attention_mask, 1.0)
            shared, _ = shared_prefix_logprobs(bf16, batch.input_ids, batch.attention_mask, batch.prefix_lengths, 1.0)
    finally:
        model.to(torch.float32)
    completion = batch.mask.bool()
    assert shared.dtype == torch.float32
    torch.testing.assert_close(shared[completion], plain[completion], atol=0.1, rtol=0.05)


def test_token_logprobs_shares_only_where_it_pays(model):
    batch = TrainBatch.from_groups(groups(), pad_id=0)
    assert shares_enough(batch.input_ids, batch.attention_mask, batch.prefix_lengths)  # 3x9 + 12x7 vs 12x16
    one_each = batch.select(torch.tensor([0, 4, 8]))  # three rows of three prompts: nothing to share
    assert not shares_enough(one_each.input_ids, one_each.attention_mask, one_each.prefix_lengths)
    no_prefix = torch.zeros_like(batch.prefix_lengths)
    assert not shares_enough(batch.input_ids, batch.attention_mask, no_prefix)
    with torch.no_grad():  # not sharing: the plain forward, prompt positions scored too
        values, _ = token_logprobs(model, one_each.input_ids, one_each.attention_mask, 1.0,
                                   prefix_lengths=one_each.prefix_lengths)
    assert (values[2, :8] != 0).all()


@pytest.mark.parametrize("mu", [1, 2])
def test_a_learner_step_with_shared_prompts_is_the_step_without(mu):
    """The whole update, through the Learner: beta > 0 (the reference pass shares prompts too),
    temperature 0.9, non-binary rewards, mu 1 (pi_old is the gradient pass) and 2 (pi_old its own
    pass); SGD, so that the weights show the gradient itself (learner_helpers.make_learner)."""
    settings = ["algo.beta=0.05", "rollout.temperature=0.9", f"algo.mu={mu}", "rollout.group_size=6"]
    batch = scored_groups(make_config(*settings))
    assert len({reward for group in batch for reward in group.rewards}) > 2  # not binary
    results = {}
    for share in (True, False):
        learner = make_learner(*settings, f"learner.share_prompts={str(share).lower()}", sgd=True)
        before = masters(learner)
        metrics = learner.train_step(batch)
        results[share] = ([after - start for after, start in zip(masters(learner), before)], metrics)
    (shared, shared_metrics), (plain, plain_metrics) = results[True], results[False]
    scale = max(update.abs().max().item() for update in plain)
    assert scale > 1e-4  # the step moved the weights
    # measured: 1.2e-7, one float32 step of a weight near 1; rows given another prompt's cache: about `scale`
    assert max((a - b).abs().max().item() for a, b in zip(shared, plain)) <= 1e-3 * scale
    for key in ("loss/total", "loss/kl", "policy/grad_norm", "policy/entropy"):
        assert shared_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-4, abs=1e-7), key


def test_shared_prompts_give_the_same_gradient_to_the_bit_every_time(model):
    """A GRPO batch's rows in a micro-batch's order (a prompt's completions apart), two threads:
    the gradient is the same sum in the same order each time. An accumulating index_put (what
    transformers' cache row selection does) sums in the threads' order and fails this."""
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(2)
    prompts = torch.randint(3, 40, (32, 8), generator=generator)
    input_ids = torch.cat([prompts.repeat_interleave(8, 0), torch.randint(3, 40, (256, 10), generator=generator)], 1)
    order = torch.randperm(256, generator=generator)  # rows of one prompt are not neighbours
    lengths = 8 + torch.randint(1, 11, (256,), generator=generator)
    attention_mask = (torch.arange(18)[None] < lengths[:, None]).long()
    input_ids, attention_mask = (input_ids * attention_mask)[order], attention_mask[order]
    weights = torch.randn(256, 17, generator=generator) * attention_mask[:, 1:]
    seen = set()
    for _ in range(6):
        logprobs, _ = shared_prefix_logprobs(model, input_ids, attention_mask, torch.full((256,), 8), 1.0)
        (logprobs * weights).sum().backward()
        seen.add(b"".join(grad.numpy().tobytes() for grad in gradients(model)))
    assert len(seen) == 1, f"{len(seen)} different gradients in 6 passes"
