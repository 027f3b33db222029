"""The training batch: scored groups as padded tensors, and the micro-batches a step is split into."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from grpo_dist.common.types import Completion, Group


@dataclass
class TrainBatch:
    """Prompt+completion sequences, right-padded, with per-token tensors aligned to targets.

    Position t of the [B, L-1] tensors scores token t+1 of `input_ids`; `mask` is 1 on
    completion tokens only. The learner fills in `old_logprobs` (pi_old) and `ref_logprobs`
    (pi_ref); they are 0 where the mask is 0.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1], float
    sampler_logprobs: torch.Tensor  # [B, L-1]
    advantages: torch.Tensor  # [B]
    old_logprobs: torch.Tensor | None = None  # [B, L-1]
    ref_logprobs: torch.Tensor | None = None  # [B, L-1]
    prefix_lengths: torch.Tensor | None = None  # [B]: the row's leading ids that its group's rows share (0: none)

    @classmethod
    def from_groups(cls, groups: list[Group], pad_id: int, advantages: torch.Tensor | None = None,
                    mask_truncated: bool = False) -> TrainBatch:
        """One row per completion (per turn of a per-turn episode), group by group; `advantages`
        (one per completion, each of its rows gets it) default to 0.

        With `mask_truncated` (DAPO's overlong filtering) a completion cut off at the length
        limit (finish_reason "length") gets mask 0 on every token: no loss, no gradient. A
        completion's `loss_mask` (multi-turn: 0 on the environment's tokens) multiplies its mask.
        """
        sequences, masks, sampler, owners = [], [], [], []  # owners[r]: the completion row r comes from
        prefixes = []
        completions = [(group.prompt_ids, completion) for group in groups for completion in group.completions]
        for index, (prompt_ids, completion) in enumerate(completions):
            in_loss = int(not (mask_truncated and completion.finish_reason == "length"))
            for ids, loss_mask, logprobs in _rows(prompt_ids, completion):
                sequences.append(ids)
                masks.append([in_loss * m for m in loss_mask[1:]])  # position t scores token t+1
                sampler.append(logprobs[1:])
                owners.append(index)
                prefixes.append(len(prompt_ids) if completion.turns is None else 0)
        width = max(len(seq) for seq in sequences)

        def pad(rows: list[list], value: float | int, length: int) -> list[list]:
            return [row + [value] * (length - len(row)) for row in rows]

        return cls(
            input_ids=torch.tensor(pad(sequences, pad_id, width)),
            attention_mask=torch.tensor(pad([[1] * len(seq) for seq in sequences], 0, width)),
            mask=torch.tensor(pad(masks, 0, width - 1), dtype=torch.float32),
            sampler_logprobs=torch.tensor(pad(sampler, 0.0, width - 1), dtype=torch.float32),
            advantages=torch.zeros(len(sequences)) if advantages is None else advantages.float()[torch.tensor(owners)],
            prefix_lengths=torch.tensor(prefixes),
        )

    @classmethod
    def concat(cls, parts: list[TrainBatch], pad_id: int) -> TrainBatch:
        """The parts' rows in order as one batch, padded as `from_groups` pads the whole (pad_id, else 0)."""

        def joined(name: str) -> torch.Tensor | None:
            tensors = [getattr(part, name) for part in parts]
            if tensors[0] is None or tensors[0].dim() == 1:
                return None if tensors[0] is None else torch.cat(tensors)
            width = max(tensor.shape[1] for tensor in tensors)
            value = pad_id if name == "input_ids" else 0
            return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])

        return cls(**{f.name: joined(f.name) for f in fields(cls)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """Tokens per sequence (prompt and completion), [B]."""
        return self.attention_mask.sum(dim=1)

    def select(self, rows: torch.Tensor) -> TrainBatch:
        """These rows, their padding cut to the longest of them."""
        width = int(self.lengths[rows].max())

        def per_token(values: torch.Tensor | None) -> torch.Tensor | None:
            return None if values is None else values[rows, : width - 1]

        return TrainBatch(
            input_ids=self.input_ids[rows, :width],
            attention_mask=self.attention_mask[rows, :width],
            mask=per_token(self.mask),
            sampler_logprobs=per_token(self.sampler_logprobs),
            advantages=self.advantages[rows],
            old_logprobs=per_token(self.old_logprobs),
            ref_logprobs=per_token(self.ref_logprobs),
            prefix_lengths=None if self.prefix_lengths is None else self.prefix_lengths[rows],
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        return replace(self, **{f.name: None if (v := getattr(self, f.name)) is None else v.to(device)
                                for f in fields(self)})

    def micro_batches(self, rows: torch.Tensor, size: int | None, max_tokens: int | None) -> list[torch.Tensor]:
        """Split `rows` into micro-batches, longest sequences first, so that padding stays small.

        A micro-batch holds at most `size` sequences and at most `max_tokens` padded tokens
        (sequences x its longest); a sequence longer than `max_tokens` goes alone. None: no limit.
        """
        lengths = self.lengths[rows]
        order = rows[torch.argsort(lengths, descending=True, stable=True)].tolist()
        longest = dict(zip(rows.tolist(), lengths.tolist()))
        parts: list[list[int]] = []
        for row in order:
            current = parts[-1] if parts else None
            if (current is None or (size is not None and len(current) >= size)
                    or (max_tokens is not None and (len(current) + 1) * longest[current[0]] > max_tokens)):
                parts.append([row])  # current[0] is the longest of a micro-batch: rows come longest first
            else:
                current.append(row)
        return [torch.tensor(part) for part in parts]


def _rows(prompt_ids: list[int], completion: Completion) -> list[tuple[list[int], list[int], list[float]]]:
    """A completion's training rows: (ids, loss mask, sampler logprobs), the last two one per id
    (0 on the prompt); a per-turn episode's are its turns."""
    if completion.turns is not None:
        return completion.turns
    length = len(completion.token_ids)
    loss_mask = [1] * length if completion.loss_mask is None else completion.loss_mask
    if len(loss_mask) != length:
        raise ValueError(f"a loss mask of {len(loss_mask)} for {length} completion tokens")
    prompt = len(prompt_ids)
    return [(prompt_ids + completion.token_ids, [0] * prompt + loss_mask, [0.0] * prompt + completion.logprobs)]
