"""Arithmetic word problems in English for a small instruct model: "Tom has 23 apples and buys 48
more. How many apples does he have now?" -> answer "71".

The real-model recipe's task (configs/smollm2_word_problems.yaml): SmolLM2-135M-Instruct gets
many of these wrong, and GRPO with `math_answer` improves it within minutes on two cores.
`python -m grpo_dist.tasks.word_problems` rewrites the assets in
grpo_dist/tasks/assets/word_problems/ (`builtin:word_problems/train.jsonl`, `eval.jsonl`).

The splits are disjoint by their numbers: every problem is one (operation, a, b) triple, the
triples are shuffled once with the seed and the first `eval_rows` are held out, so no held-out
problem shares its operation and both numbers with a training problem, whatever its wording.
"""

from __future__ import annotations

import random
from pathlib import Path

from grpo_dist.tasks.splits import splits_main

ASSET_DIR = Path(__file__).parent / "assets" / "word_problems"
NAMES = ("Tom", "Anna", "Ben", "Lucy", "Sam", "Maria", "Leo", "Emma", "Omar", "Nina", "Jack", "Sofia")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards", "coins")

# operation -> wordings; {n} is a name, {i} the items, {a} and {b} the numbers.
TEMPLATES = {
    "add": (
        "{n} has {a} {i} and buys {b} more. How many {i} does {n} have now?",
        "{n} had {a} {i}. A friend gave {n} {b} more {i}. How many {i} does {n} have in total?",
        "There are {a} {i} in one box and {b} {i} in another box. How many {i} are there altogether?",
    ),
    "subtract": (
        "{n} has {a} {i} and gives away {b} of them. How many {i} does {n} have left?",
        "There were {a} {i} on the table. {n} took {b} of them. How many {i} are still on the table?",
        "{n} collected {a} {i} and lost {b} of them. How many {i} does {n} have now?",
    ),
    "multiply": (
        "{n} has {a} bags with {b} {i} in each bag. How many {i} does {n} have?",
        "There are {a} rows of {i} with {b} {i} in each row. How many {i} are there?",
    ),
}


def problems() -> list[tuple[str, int, int]]:
    """Every (operation, a, b) with small numbers: a + b for a, b in 1..20, a - b for
    1 <= b < a <= 30, a * b for a in 2..9, b in 2..12 (923 problems). With two-digit operands
    the model is almost never right (2% of 48 problems), too far for a few minutes of RL."""
    triples = [("add", a, b) for a in range(1, 21) for b in range(1, 21)]
    triples += [("subtract", a, b) for a in range(2, 31) for b in range(1, a)]
    triples += [("multiply", a, b) for a in range(2, 10) for b in range(2, 13)]
    return triples


def answer(operation: str, a: int, b: int) -> int:
    return {"add": a + b, "subtract": a - b, "multiply": a * b}[operation]


def render(triple: tuple[str, int, int], rng: random.Random) -> dict:
    """One row: the problem in words (a random wording, name and items), its answer as text."""
    operation, a, b = triple
    text = rng.choice(TEMPLATES[operation]).format(n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b)
    return {"prompt": text, "answer": str(answer(operation, a, b)), "operation": operation, "numbers": [a, b]}


def make_splits(seed: int = 0, eval_rows: int = 300) -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows: every problem once, shuffled with `seed`; the first `eval_rows`
    are held out, so the splits are disjoint by (operation, a, b)."""
    rng = random.Random(seed)
    triples = problems()
    rng.shuffle(triples)
    rows = [render(t, rng) for t in triples]
    return rows[eval_rows:], rows[:eval_rows]


def main() -> None:
    splits_main(__doc__.split("\n")[0], ASSET_DIR, make_splits)


if __name__ == "__main__":
    main()
