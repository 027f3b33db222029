"""The transformers engine's decode step without the two copies of the KV cache transformers makes.

A decode step appends one token per row to every layer's cache and attends over it. With
transformers' defaults each step copies the whole cache twice in every layer:

- `DynamicCache` grows by `torch.cat`, a new tensor each step;
- the SDPA attention of a grouped-query model (SmolLM2-135M: 9 query heads share 3 key/value
  heads) repeats each key/value head for its query heads (`repeat_kv`) whenever it is given a
  mask, and left-padded batches always have one.

Here the cache is allocated once, for the prompt and every token the engine may sample
(`preallocated_cache`), and attention groups the query heads of a key/value head as rows of one
query (`grouped_decode_attention`), so the keys and values are read where they lie. Both compute
what transformers computes: the same SDPA kernel over the same keys and values, the query
heads in another arrangement (float32 rounding apart). docs/speed.md has the measurements.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

GROUPED_DECODE = "grpo_dist_grouped_decode"


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA attention (transformers' signature); a one-token query of a grouped-query model attends
    with its query heads grouped by key/value head instead of repeating the keys and values.

    query [batch, heads, 1, dim], key and value [batch, kv_heads, length, dim]. Query head h uses
    key/value head h // groups (transformers' `repeat_kv` order), so the view
    [batch, kv_heads, groups, dim] puts each key/value head's query heads in its rows; a one-token
    query has no causal order among them, and the mask ([batch, 1, 1, length]) is the same for all.
    Anything else (a prompt's prefill, dropout, a mask per head) goes to transformers' SDPA path.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, query_length, dim = query.shape
    mask_per_head = attention_mask is not None and attention_mask.shape[1] != 1
    if query_length != 1 or groups == 1 or (dropout and module.training) or mask_per_head:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.view(batch, heads // groups, groups, dim)
    output = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                              scale=scaling)
    return output.view(batch, heads, 1, dim).transpose(1, 2), None


AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
AttentionMaskInterface.register(GROUPED_DECODE, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # the masks SDPA takes


def use_grouped_decode(model: PreTrainedModel) -> None:
    """Switch a model that attends with SDPA to `grouped_decode_attention` (others stay as they are)."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(GROUPED_DECODE)


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers of `room` positions, allocated at the first update;
    each update writes its positions in place and returns views of the filled part."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room, self.length = room, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, kv_heads, _, dim = key_states.shape
        self.keys = key_states.new_empty(batch, kv_heads, self.room, dim)
        self.values = value_states.new_empty(batch, kv_heads, self.room, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.room:
            raise ValueError(f"the cache has room for {self.room} positions, not {end}")
        self.keys[:, :, self.length : end] = key_states
        self.values[:, :, self.length : end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length


def preallocated_cache(config: PretrainedConfig, room: int) -> Cache:
    """A KV cache of `room` positions per row for a model whose layers all attend to every
    position; any other model (sliding windows, linear attention) gets transformers' own."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        return Cache(layers=[PreallocatedLayer(room) for _ in cache.layers])
    return cache
