"""A bundled code task: small Python problems checked by unit tests.

Each row of problems.jsonl has "id", "prompt" (the statement with the signature to
write), "tests" (assert statements for `grpo_dist.reward.code.run_tests`), "reference"
(a correct solution) and "entry_point" (the function's name). The problems were written
for this project. Score completions with `grpo_dist.reward.code.unit_test_reward`,
which receives a row's "tests" as a keyword field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROBLEMS_PATH = Path(__file__).with_name("problems.jsonl")


def load_problems() -> list[dict[str, Any]]:
    """Every problem of problems.jsonl, in file order."""
    with PROBLEMS_PATH.open(encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]
