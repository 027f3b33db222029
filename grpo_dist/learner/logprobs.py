"""Token log-probabilities of a causal LM at the sampling temperature, computed in float32.

A GRPO batch holds G completions of every prompt. `token_logprobs` given the rows' prefix
lengths (their prompts) runs each distinct prompt once and lets its completions attend to its
keys and values (`shared_prefix_logprobs`); the result is the plain forward's, up to float
rounding, for fewer tokens: gradients flow through the shared prompt's activations to every
completion that attends to them.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_dist.common.distinct import distinct_rows
from grpo_dist.learner.batch import TrainBatch

# Share prompts only where it cuts the tokens run to this share of the plain forward's or less:
# two forwards instead of one cost a little of their own.
SHARE_BELOW = 0.8


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float, with_entropy: bool = False, prefix_lengths: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token_{t+1} | tokens_<=t) of the distribution softmax(logits / T), [B, L-1], float32.

    With `with_entropy`, also H_t = -sum_v pi_v log pi_v of that distribution per position,
    from the same forward pass and without gradient (None otherwise). Rows are right-padded.
    With `prefix_lengths` (per row, the leading ids it shares with other rows: its prompt), the
    prompts are shared where `shares_enough` says it pays; then positions before a row's last
    prefix token are 0 (no completion token is scored there).
    """
    if prefix_lengths is not None and shares_enough(input_ids, attention_mask, prefix_lengths):
        return shared_prefix_logprobs(model, input_ids, attention_mask, prefix_lengths, temperature, with_entropy)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    return _scored(logits, input_ids[:, 1:], temperature, with_entropy)


def _scored(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
            with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The targets' log pi at each position, and the entropy there (with_entropy)."""
    all_logprobs = (logits.float() / temperature).log_softmax(dim=-1)  # log softmax(z / T), in float32
    logprobs = all_logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(all_logprobs.exp() * all_logprobs).sum(dim=-1)  # H_t = -sum_v pi_v log pi_v
    return logprobs, entropy


def _distinct_prefixes(input_ids: torch.Tensor, prefix_lengths: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    """The distinct prefixes, and for each row the index of its own."""
    prefixes = [ids[:length] for ids, length in zip(input_ids.tolist(), prefix_lengths.tolist())]
    first, owners = distinct_rows(prefixes)
    return [prefixes[index] for index in first], owners


def shares_enough(input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_lengths: torch.Tensor) -> bool:
    """Whether sharing runs at most SHARE_BELOW of the plain forward's tokens: U distinct prefixes
    of up to P tokens, then B suffixes of up to S, against B rows of L. Every row needs a prefix."""
    if int(prefix_lengths.min()) < 1:
        return False
    prefixes, _ = _distinct_prefixes(input_ids, prefix_lengths)
    suffix = int((attention_mask.sum(dim=1) - prefix_lengths).max())
    shared = len(prefixes) * max(map(len, prefixes)) + len(input_ids) * suffix
    return shared <= SHARE_BELOW * input_ids.numel()


def shared_prefix_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           prefix_lengths: torch.Tensor, temperature: float, with_entropy: bool = False,
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` with each distinct prefix run once (every prefix length >= 1).

    1. The U distinct prefixes, left-padded to P, run with a KV cache; the cache is then indexed
       per row (rows of one prompt share its tensors, so its gradient is the sum over them), and
       the prefix's last logits score each row's first suffix token.
    2. The B suffixes, right-padded to S, run against that cache, at positions p_r, p_r+1, ...;
       position j scores suffix token j+1.
    3. Suffix token j of row r is token p_r + j of the row: its score goes to position p_r + j - 1.
    """
    device, rows = input_ids.device, len(input_ids)
    prefixes, owners = _distinct_prefixes(input_ids, prefix_lengths)
    width = max(map(len, prefixes))
    prefix_ids = torch.tensor([[0] * (width - len(p)) + p for p in prefixes], device=device)
    prefix_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes], device=device)
    out = model(input_ids=prefix_ids, attention_mask=prefix_mask, use_cache=True, logits_to_keep=1,
                position_ids=(prefix_mask.cumsum(dim=-1) - 1).clamp(min=0))
    owner = torch.tensor(owners, device=device)
    cache = out.past_key_values
    select_rows(cache, owner)
    first_logits = out.logits[:, -1].index_select(0, owner)  # [B, V]: scores each row's token p_r

    lengths, starts = attention_mask.sum(dim=1), prefix_lengths.to(device)
    suffix = int((lengths - starts).max())
    offsets = torch.arange(suffix, device=device)
    positions = starts[:, None] + offsets  # [B, S]: where suffix token j sits in its row
    valid = positions < lengths[:, None]
    suffix_ids = torch.where(valid, input_ids.gather(1, positions.clamp(max=input_ids.shape[1] - 1)), 0)
    suffix_logits = model(input_ids=suffix_ids, attention_mask=torch.cat([prefix_mask[owner], valid.long()], dim=1),
                          position_ids=positions, past_key_values=cache, use_cache=True).logits
    logits = torch.cat([first_logits[:, None], suffix_logits[:, :-1]], dim=1)  # position j scores suffix token j
    logprobs, entropy = _scored(logits, suffix_ids, temperature, with_entropy)

    def placed(values: torch.Tensor) -> torch.Tensor:
        """Suffix token j of row r scored at position p_r + j - 1 of [B, L-1]; 0 elsewhere."""
        result = values.new_zeros(rows, input_ids.shape[1] - 1)
        row_index = torch.arange(rows, device=device)[:, None].expand_as(positions)
        result[row_index[valid], positions[valid] - 1] = values[valid]
        return result

    return placed(logprobs), None if entropy is None else placed(entropy)


def select_rows(cache: Any, owner: torch.Tensor) -> None:
    """Row r of every layer's keys and values becomes the prefix's `owner[r]`, by index_select.

    Not `cache.batch_select_indices` (transformers indexes `keys[owner]`): that backward is an
    accumulating index_put, whose float sums on the CPU run in the threads' order (runs differed
    at 5e-5 after 6 steps); index_select's backward, index_add, adds in the index's order.
    """
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, owner)
        layer.values = layer.values.index_select(0, owner)


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TrainBatch, micro_batches: list[torch.Tensor | None],
                   temperature: float, device: torch.device | str, share_prompts: bool = False) -> torch.Tensor:
    """`token_logprobs` of every row of `batch`, one micro-batch at a time, [B, L-1] on the CPU
    (prompts shared within a micro-batch with `share_prompts`).

    0 where the mask is 0 (prompt and padding positions). A None micro-batch is an empty one
    (sharded ranks run the same passes): a pass on row 0 whose result is dropped.
    """
    values = torch.zeros_like(batch.mask)
    for rows in micro_batches:
        if rows is None:
            token_logprobs(model, *(t.to(device) for t in (batch.input_ids[:1], batch.attention_mask[:1])), temperature)
            continue
        micro = batch.select(rows).to(device)
        logprobs, _ = token_logprobs(model, micro.input_ids, micro.attention_mask, temperature,
                                     prefix_lengths=micro.prefix_lengths if share_prompts else None)
        values[rows, : logprobs.shape[1]] = logprobs.cpu()
    return torch.where(batch.mask.bool(), values, torch.zeros_like(values))
