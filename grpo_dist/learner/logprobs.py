"""Token log-probabilities of a causal LM at the sampling temperature, computed in float32."""

from __future__ import annotations

import torch

from grpo_dist.learner.batch import TrainBatch


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token_{t+1} | tokens_<=t) of the distribution softmax(logits / T), [B, L-1], float32.

    With `with_entropy`, also H_t = -sum_v pi_v log pi_v of that distribution per position,
    from the same forward pass and without gradient (None otherwise).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    all_logprobs = (logits.float() / temperature).log_softmax(dim=-1)  # log softmax(z / T), in float32
    logprobs = all_logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(all_logprobs.exp() * all_logprobs).sum(dim=-1)  # H_t = -sum_v pi_v log pi_v
    return logprobs, entropy


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TrainBatch, micro_batches: list[torch.Tensor | None],
                   temperature: float, device: torch.device | str) -> torch.Tensor:
    """`token_logprobs` of every row of `batch`, one micro-batch at a time, [B, L-1] on the CPU.

    0 where the mask is 0 (prompt and padding positions). A None micro-batch is an empty one
    (sharded ranks run the same passes): a pass on row 0 whose result is dropped.
    """
    values = torch.zeros_like(batch.mask)
    for rows in micro_batches:
        if rows is None:
            token_logprobs(model, *(t.to(device) for t in (batch.input_ids[:1], batch.attention_mask[:1])), temperature)
            continue
        micro = batch.select(rows).to(device)
        logprobs, _ = token_logprobs(model, micro.input_ids, micro.attention_mask, temperature)
        values[rows, : logprobs.shape[1]] = logprobs.cpu()
    return torch.where(batch.mask.bool(), values, torch.zeros_like(values))
