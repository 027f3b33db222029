"""A generated task's two splits written as JSONL (train.jsonl, eval.jsonl), and the command line
of a task that is nothing but its seeded splits."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

Rows = list[dict]


def write_splits(out: Path, train: Rows, held_out: Rows) -> None:
    """`out`/train.jsonl and `out`/eval.jsonl, one JSON object a line."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("eval.jsonl", held_out)):
        (out / name).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def splits_main(description: str, default_out: Path, make_splits: Callable[[int], tuple[Rows, Rows]]) -> None:
    """`python -m grpo_dist.tasks.<task> [--out DIR] [--seed N]`: write the task's splits."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    train, held_out = make_splits(args.seed)
    write_splits(args.out, train, held_out)
    print(f"wrote {len(train)} training and {len(held_out)} held-out rows to {args.out}")
