"""Datasets: JSONL rows, prompt templates, tokenized prompts, and a deterministic cursor."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Generic, TypeVar

from grpo_dist.config import resolve_path
from grpo_dist.types import Prompt

T = TypeVar("T")


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file (`builtin:` paths allowed); blank lines are skipped."""
    rows = []
    with Path(resolve_path(path)).open() as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not valid JSON: {exc}") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def render_prompt(template: str, row: dict[str, Any]) -> str:
    """Fill `template` (str.format) with the row's fields."""
    try:
        return template.format(**row)
    except KeyError as exc:
        raise ValueError(f"prompt_template names field {exc} that the row lacks: {sorted(row)}") from None


def build_prompts(rows: list[dict[str, Any]], template: str, tokenizer: Any) -> list[Prompt]:
    """Render every row with `template` and tokenize it once, here in the driver."""
    prompts = []
    for index, row in enumerate(rows):
        text = render_prompt(template, row)
        prompts.append(Prompt(index=index, row=row, text=text, ids=tokenizer(text)["input_ids"]))
    return prompts


class PromptCursor(Generic[T]):
    """Walks the rows in a seeded random order, reshuffling at every epoch."""

    def __init__(self, rows: list[T], seed: int) -> None:
        self.rows = rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def state(self) -> dict[str, int]:
        """Where the cursor stands, for a checkpoint; `restore` continues from here."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "rows": len(self.rows)}

    def restore(self, state: dict[str, int]) -> None:
        """Continue from `state()` of a cursor over the same rows with the same seed."""
        if (state["seed"], state["rows"]) != (self.seed, len(self.rows)):
            raise ValueError(
                f"the checkpoint's data cursor walked {state['rows']} rows with seed {state['seed']}; "
                f"this run has {len(self.rows)} rows with seed {self.seed}"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled(self.epoch)

    def next_batch(self, size: int) -> list[T]:
        batch = []
        while len(batch) < size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            batch.append(self.rows[self._order[self.position]])
            self.position += 1
        return batch
