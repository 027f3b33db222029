"""env/code_feedback.py: public tests' failures come back as the next turn, the hidden tests score
each attempt, discounted per extra attempt (the sandbox runs the model's code)."""

from grpo_dist.tasks.data import read_jsonl
from grpo_dist.env.base import check_step
from grpo_dist.env.arithmetic_retry import ArithmeticRetry
from grpo_dist.env.code_feedback import CodeFeedback
from grpo_dist.env.python_tool import PythonTool
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


def test_python_tool_runs_code_in_the_sandbox_and_scores_the_final_answer():
    assert load_environment("python_tool") is PythonTool
    env = PythonTool(timeout_s=2.0)
    assert env.reset({"prompt": "What is 6 times 7?", "answer": "42"}).startswith("What is 6 times 7?\n")
    printed = check_step(env.step("Let me compute.\n```python\nprint(6 * 7)\n```"))
    assert printed.observation == [{"role": "tool", "content": "42"}] and not printed.done
    raised = check_step(env.step("```python\nraise ValueError('bad input')\n```"))
    assert raised.observation[0]["content"].endswith("ValueError: bad input")
    assert "sandbox.py" not in raised.observation[0]["content"] and raised.info == {"calls": 2, "status": "error"}
    final = check_step(env.step("So the answer is \\boxed{42}."))
    assert final.done and final.reward == 1.0 and final.info == {"calls": 2}
    text = PythonTool(tool_role=None)
    text.reset({"prompt": "p", "answer": "5"})
    assert text.step("```\nprint(1)\n```").observation == "\nOutput:\n1\n"
    assert text.step("It is \\boxed{4}").reward == 0.0
    asked = PythonTool(prompt_field="question")  # GSM8K's rows (configs/math_tool.yaml)
    assert asked.reset({"question": "How many?", "answer": "So #### 3"}).startswith("How many?\nYou may run Python")
    assert asked.step("\\boxed{3}").reward == 1.0


def test_arithmetic_retry_asks_again_and_discounts_the_second_attempt():
    assert load_environment("arithmetic_retry") is ArithmeticRetry
    env = ArithmeticRetry(discount=0.5)
    assert env.reset({"prompt": "58+67=", "answer": "125"}) == "58+67="
    wrong = check_step(env.step("<answer>15</answer>"))
    assert (wrong.observation, wrong.reward, wrong.done) == ("58+67=", 0.0, False)
    right = check_step(env.step("<answer>125</answer>"))
    assert (right.reward, right.done, right.info) == (0.5, True, {"attempt": 2, "correct": True})
    first = ArithmeticRetry()
    first.reset({"prompt": "1+2=", "answer": "3"})
    assert first.step("<answer>3</answer>").reward == 1.0
