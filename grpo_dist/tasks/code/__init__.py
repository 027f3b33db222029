"""A bundled code task: small Python problems checked by unit tests.

Each row of problems.jsonl has "id", "prompt" (the statement with the signature to
write), "tests" (assert statements for `grpo_dist.reward.unit_tests.run_tests`), "reference"
(a correct solution) and "entry_point" (the function's name). The problems were written
for this project. Score completions with `grpo_dist.reward.unit_tests.unit_test_reward`,
which receives a row's "tests" as a keyword field.

`python -m grpo_dist.tasks.code` writes the trainer's data files, train.jsonl and
eval.jsonl in grpo_dist/tasks/assets/code/ (`builtin:code/train.jsonl`): the same rows
without the reference solutions, every fourth problem held out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROBLEMS_PATH = Path(__file__).with_name("problems.jsonl")
ASSET_DIR = Path(__file__).parent.parent / "assets" / "code"
TRAINER_FIELDS = ("id", "prompt", "tests", "entry_point")


def load_problems() -> list[dict[str, Any]]:
    """Every problem of problems.jsonl, in file order."""
    with PROBLEMS_PATH.open(encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def make_splits(problems: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and eval rows for the trainer: no reference solutions; every fourth problem is eval."""
    rows = [{key: value for key, value in p.items() if key in TRAINER_FIELDS} for p in problems]
    return [r for i, r in enumerate(rows) if i % 4 != 3], [r for i, r in enumerate(rows) if i % 4 == 3]


def write_splits(directory: Path = ASSET_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in zip(("train", "eval"), make_splits(load_problems())):
        text = "".join(json.dumps(row) + "\n" for row in rows)
        (directory / f"{name}.jsonl").write_text(text, encoding="utf-8")
