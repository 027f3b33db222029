"""Rule rewards: is the final answer right, is the completion in the expected format."""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_tagged_answer(completion: str) -> str | None:
    """The text of the last `<answer>...</answer>`, stripped; None when there is none."""
    found = ANSWER_TAG.findall(completion)
    return found[-1].strip() if found else None


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def exact_answer(prompt: str, completion: str, answer: str, **fields: object) -> float:
    """1.0 when the tagged answer equals the row's `answer` (as text, or as the same number)."""
    given = extract_tagged_answer(completion)
    if given is None:
        return 0.0
    expected = str(answer).strip()
    if given == expected:
        return 1.0
    given_number, expected_number = _as_number(given), _as_number(expected)
    return float(given_number is not None and given_number == expected_number)


def answer_format(prompt: str, completion: str, **fields: object) -> float:
    """1.0 when the completion is exactly one `<answer>...</answer>` block, nothing around it."""
    return float(re.fullmatch(r"\s*<answer>[^<]*</answer>\s*", completion) is not None)
