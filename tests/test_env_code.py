"""env/code_feedback.py: public tests' failures come back as the next turn, the hidden tests score
each attempt, discounted per extra attempt (the sandbox runs the model's code)."""

from grpo_dist.data import read_jsonl
from grpo_dist.env.base import check_step
from grpo_dist.env.code_feedback import CodeFeedback
from grpo_dist.env.registry import load_environment

WRONG = "```python\ndef reverse_words(s):\n    return s\n```"
HALF = "```python\ndef reverse_words(s):\n    return ' '.join(s.split(' ')[::-1])\n```"
RIGHT = "Here:\n```python\ndef reverse_words(s):\n    return ' '.join(s.split()[::-1])\n```"


def row() -> dict:
    found = [r for r in read_jsonl("builtin:code/train.jsonl") if r["id"] == "reverse_words"]
    assert len(found[0]["tests"]) == 5  # 2 public, 3 hidden
    return found[0]


def test_failures_come_back_and_the_rewards_sum_to_the_last_attempts_discounted_score():
    assert load_environment("code_feedback") is CodeFeedback
    env = CodeFeedback(public_tests=2, discount=0.5)
    assert env.reset(row()).startswith("Write a Python function `reverse_words(s: str) -> str`.")
    first = check_step(env.step(WRONG))
    assert not first.done and first.observation.startswith("0 of 2 tests passed (failed).")
    assert "assert reverse_words('hello world') == 'world hello'" in first.observation
    assert "sandbox.py" not in first.observation
    hidden_first = first.info["hidden_passed"] / 3
    second = check_step(env.step(RIGHT))
    assert second.done and second.info == {"attempt": 2, "public_passed": 2, "hidden_passed": 3, "hidden_total": 3,
                                           "status": "passed"}
    assert first.reward == hidden_first and first.reward + second.reward == 1.0 * 0.5  # attempt 2: x 0.5


def test_a_first_attempt_that_passes_scores_its_hidden_pass_rate():
    env = CodeFeedback(public_tests=1)
    env.reset(row())
    step = env.step(HALF)  # passes 'hello world' (public) but not the whitespace tests
    assert step.done and step.reward == step.info["hidden_passed"] / 4 < 1
