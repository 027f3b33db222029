"""Rule rewards: is the final answer right, is the completion in the expected format, how long is it."""

from __future__ import annotations

import functools
import logging
import re
from fractions import Fraction
from types import ModuleType

from grpo_dist.reward.registry import inline

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
HASHES = re.compile(r"####\s*([^\n]+)")
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# <think>…</think> then <answer>…</answer>, neither tag repeated, whitespace around.
THINK_ANSWER = r"\s*<think>((?!</?think>).)*</think>\s*<answer>((?!</?answer>).)*</answer>\s*"


def extract_tagged_answer(completion: str) -> str | None:
    """The text of the last `<answer>...</answer>`, stripped; None when there is none."""
    found = ANSWER_TAG.findall(completion)
    return found[-1].strip() if found else None


def extract_boxed(completion: str) -> str | None:
    r"""The contents of the last `\boxed{...}` (nested braces allowed); None if none is closed."""
    starts = [match.end() for match in BOXED.finditer(completion)]
    if not starts:
        return None
    depth = 1
    for position in range(starts[-1], len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[position], 0)
        if depth == 0:
            return completion[starts[-1] : position].strip()
    return None


def extract_final_answer(completion: str) -> str | None:
    r"""The final answer: the last \boxed{}, else the last <answer> tag, else "#### x", else the last number."""
    hashes, numbers = HASHES.findall(completion), NUMBER.findall(completion)
    for candidate in (
        extract_boxed(completion),
        extract_tagged_answer(completion),
        hashes[-1].strip() if hashes else None,
        numbers[-1] if numbers else None,
    ):
        if candidate:
            return candidate
    return None


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


@inline
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


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; ours is the pool's deadline."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _logger in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_logger).addFilter(_DropTimeoutDisabledWarning())


@functools.cache
def _math_verify() -> tuple[ModuleType, tuple]:
    """math-verify and its extraction targets, imported at the first math_answer: importing it takes
    0.4 s, which every launch paid before Ray started (the config check imports this module)."""
    import math_verify

    return math_verify, (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())


def _parse_math(text: str) -> list:
    # Timeouts off: math-verify's own use signal.alarm, which fails off the main thread
    # and replaces the process's SIGALRM handler. The scoring pool's deadline bounds a hang.
    math_verify, targets = _math_verify()
    return math_verify.parse(f"${text}$", extraction_config=targets, parsing_timeout=None)


def math_answer(prompt: str, completion: str, answer: str, **fields: object) -> float:
    r"""1.0 when the completion's final answer is mathematically equal to the row's `answer`.

    The final answer is found by `extract_final_answer`; both sides are parsed and compared
    with math-verify (1/2 = 0.5 = \frac{1}{2}). Raises ValueError when `answer` itself
    cannot be parsed, so that bad reference data shows up as failures, not as zeros.
    """
    gold = _parse_math(str(answer))
    if not gold:
        raise ValueError(f"cannot parse the reference answer {answer!r}")
    given = extract_final_answer(completion)
    if given is None:
        return 0.0
    return float(_math_verify()[0].verify(gold, _parse_math(given), timeout_seconds=None))


def answer_format(prompt: str, completion: str, pattern: str = THINK_ANSWER, **fields: object) -> float:
    """1.0 when the whole completion matches `pattern` (re.fullmatch, `.` matching newlines too)."""
    return float(re.fullmatch(pattern, completion, re.DOTALL) is not None)


def _check_pattern(pattern: str = THINK_ANSWER) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None


answer_format.check_options = _check_pattern  # type: ignore[attr-defined]


@inline
def length_penalty(
    prompt: str, completion: str, completion_tokens: int, soft_length: int, max_length: int, **fields: object
) -> float:
    """DAPO's overlong penalty: 0 up to `soft_length` tokens, then linearly down to -1 at `max_length`."""
    if completion_tokens <= soft_length:
        return 0.0
    return max(-1.0, (soft_length - completion_tokens) / (max_length - soft_length))


def _check_lengths(soft_length: int | None = None, max_length: int | None = None) -> None:
    if soft_length is None or max_length is None:
        raise ValueError("length_penalty needs the options soft_length and max_length (tokens)")
    if not 0 <= soft_length < max_length:
        raise ValueError(f"length_penalty needs 0 <= soft_length < max_length, got {soft_length}, {max_length}")


length_penalty.check_options = _check_lengths  # type: ignore[attr-defined]
