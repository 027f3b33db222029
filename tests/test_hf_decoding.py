"""The transformers engine's decode step (rollout/hf_decoding.py): grouped-query attention without
repeating keys and values, and a KV cache written in place, held to attention computed by hand and
to a forward without any cache.

Grouped-query models with several key/value heads (6 query heads over 2 here, as SmolLM2's 9
over 3): with one key/value head any arrangement of the query heads would pass.
"""

import math

import pytest
import torch
from transformers import Qwen2Config

from grpo_dist.rollout.hf_decoding import PreallocatedLayer, grouped_decode_attention, preallocated_cache
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.common.types import SamplingSettings
from grpo_dist.rollout.sampling import sampled_logprobs
from grpo_dist.tasks.tiny import build_tokenizer, save_tiny_model

HEADS, KV_HEADS, DIM = 6, 2, 16


class Attention(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS


def attention_by_hand(query, key, value, keep, scale):
    """softmax(q . k * scale) v over the kept positions, query head h on key/value head h // groups."""
    groups = HEADS // KV_HEADS
    out = torch.empty_like(query)
    for b in range(query.shape[0]):
        for h in range(HEADS):
            k, v = key[b, h // groups][keep[b]], value[b, h // groups][keep[b]]
            weights = ((k @ query[b, h, 0]) * scale).softmax(dim=0)
            out[b, h, 0] = weights @ v
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_decode_step_attends_as_each_query_head_to_its_own_key_value_head(dtype, tolerance):
    """Against attention by hand in float32 on the same (bf16-rounded) inputs."""
    generator = torch.Generator().manual_seed(0)
    batch, length = 3, 7
    query = torch.randn(batch, HEADS, 1, DIM, generator=generator).to(dtype)
    key, value = (torch.randn(batch, KV_HEADS, length, DIM, generator=generator).to(dtype) for _ in range(2))
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[1, :3] = keep[2, :5] = False  # left padding
    scale = 1 / math.sqrt(DIM)
    output, _ = grouped_decode_attention(Attention(), query, key, value, keep[:, None, None, :], scaling=scale)
    assert output.shape == (batch, 1, HEADS, DIM) and output.dtype == dtype
    expected = attention_by_hand(query.float(), key.float(), value.float(), keep, scale)
    torch.testing.assert_close(output.float(), expected, rtol=0, atol=tolerance)


@torch.no_grad()
def test_the_transformers_engine_samples_with_the_logprobs_of_a_forward_without_cache(tmp_path):
    """Ragged prompts (left padding), temperature 0.8, G=3, up to 20 tokens, rows leaving the batch
    as they stop: every completion's logprobs are those of its prompt and tokens run at once."""
    model = save_tiny_model(tmp_path, "llama", num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM,
                            initializer_range=0.2)
    engine = HFEngine(str(tmp_path))
    assert engine.model.config._attn_implementation == "grpo_dist_grouped_decode"
    vocab = len(build_tokenizer())
    prompts = torch.randint(5, vocab, (3, 6), generator=torch.Generator().manual_seed(1)).tolist()
    prompts = [prompts[0][:2], prompts[1], prompts[2][:4]]
    sampling = SamplingSettings(n=3, temperature=0.8, max_new_tokens=20)
    groups = engine.generate(prompts, sampling, [7, 8, 9])
    assert max(len(c.token_ids) for g in groups for c in g) == 20
    for prompt, group in zip(prompts, groups):
        for completion in group:
            ids = torch.tensor([prompt + completion.token_ids])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
            expected = sampled_logprobs(logits, sampling).gather(-1, ids[0, len(prompt):, None])[:, 0]
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=0, atol=1e-4)


def test_the_preallocated_cache_keeps_what_it_was_given_and_refuses_more_than_its_room():
    layer = PreallocatedLayer(room=5)
    first, second = torch.randn(2, KV_HEADS, 3, DIM), torch.randn(2, KV_HEADS, 2, DIM)
    layer.update(first, -first)
    keys, values = layer.update(second, -second)
    torch.testing.assert_close(keys, torch.cat([first, second], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, -keys, rtol=0, atol=0)
    assert layer.get_seq_length() == 5
    with pytest.raises(ValueError, match="room for 5 positions, not 6"):
        layer.update(second[:, :, :1], second[:, :, :1])


def test_a_model_with_sliding_window_layers_keeps_transformers_own_cache():
    config = Qwen2Config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                         use_sliding_window=True)
    assert not any(isinstance(layer, PreallocatedLayer) for layer in preallocated_cache(config, room=16).layers)
    plain = Qwen2Config(num_hidden_layers=2)
    assert all(isinstance(layer, PreallocatedLayer) for layer in preallocated_cache(plain, room=16).layers)
