"""Rule rewards: final-answer extraction, math_answer with math-verify, format, length penalty, options."""

import threading
import time

import pytest

from grpo_dist.config.schema import ConfigError, load_config
from grpo_dist.reward.pool import ScoreOutcome, ScoringPool
from grpo_dist.reward.registry import BUILTIN_REWARDS, load_reward, reward_kind
from grpo_dist.reward.rules import answer_format, extract_final_answer, length_penalty, math_answer

# A power tower that sympy tries to evaluate: math-verify does not return on it.
HANGING_ANSWER = r"The answer is \boxed{2^{2^{2^{2^{2^{10}}}}}}"


@pytest.mark.parametrize(
    "completion,expected",
    [
        (r"so \boxed{\frac{1}{2}} and later \boxed{\frac{\sqrt{3}}{2}}.", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{\{1, \{2\}\}}", r"\{1, \{2\}\}"),
        (r"<answer>7</answer> then \boxed{8}", "8"),
        ("<answer> x = 3 </answer> and 5", "x = 3"),
        ("so we get\n#### 1,234\n", "1,234"),
        ("there are 3 cats and 12.5 dogs, 2/3 of them", "2/3"),
        (r"unclosed \boxed{12 but <answer>4</answer>", "4"),
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_final_answer(completion, expected):
    assert extract_final_answer(completion) == expected


@pytest.mark.parametrize(
    "completion,answer",
    [
        (r"\boxed{\frac{1}{2}}", "0.5"),
        ("<answer>0.5</answer>", r"\frac{1}{2}"),
        ("#### 1/2", "0.5"),
        (r"$\boxed{\dfrac{2}{4}}$", "1/2"),
        ("we end with 1,024", "1024"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{x = 5}", "5"),
        (r"\boxed{\{2, 1\}}", r"\{1, 2\}"),
    ],
)
def test_equivalent_answers_score_one(completion, answer):
    assert math_answer("p", completion, answer=answer) == 1.0


@pytest.mark.parametrize(
    "completion,answer",
    [
        (r"\boxed{0.51}", "1/2"),
        (r"\boxed{-5}", "5"),
        (r"\boxed{x + 1}", "x + 2"),
        ("<answer>3</answer>", "4"),
        (r"\boxed{(2, 1)}", "(1, 2)"),
        ("first 1/2 then the last number 3", "1/2"),  # only the final answer counts
    ],
)
def test_different_answers_score_zero(completion, answer):
    assert math_answer("p", completion, answer=answer) == 0.0


@pytest.mark.parametrize(
    "completion",
    ["", "I do not know.", r"\boxed{", r"\boxed{}", "<answer></answer>", r"\boxed{\frac{1}{}}", "#### ???", "}{$$\\"],
)
def test_malformed_completions_score_zero(completion):
    assert math_answer("p", completion, answer="1/2") == 0.0


def test_an_unparseable_reference_answer_raises():
    with pytest.raises(ValueError, match="reference answer"):
        math_answer("p", r"\boxed{1}", answer="")


def test_math_answer_works_off_the_main_thread():
    """math-verify's own timeouts use signal.alarm, which fails off the main thread; ours are off."""
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(math_answer("p", r"\boxed{0.5}", answer="1/2")))
    thread.start()
    thread.join(30)
    assert results == [1.0]


@pytest.mark.timeout(60)
def test_a_hanging_verifier_costs_a_timeout_and_the_pool_keeps_working():
    spec = BUILTIN_REWARDS["math_answer"]
    with ScoringPool(num_workers=1, timeout_s=1.0) as pool:
        warm = [pool.score(spec, [("p", r"\boxed{1/2}", {"answer": "0.5"})]) for _ in range(3)]  # the first
        assert warm[-1] == [ScoreOutcome(1.0)]  # may time out importing math_verify on a busy machine
        start = time.monotonic()
        [hung] = pool.score(spec, [("p", HANGING_ANSWER, {"answer": "1"})])
        assert hung == ScoreOutcome(None, "timeout") and time.monotonic() - start < 1.0 + 1.0
        items = [("p", r"\boxed{0.5}", {"answer": "1/2"}), ("p", r"\boxed{3}", {"answer": "4"})]
        assert pool.score(spec, items) == [ScoreOutcome(1.0), ScoreOutcome(0.0)]


def test_answer_format_default_pattern():
    assert answer_format("p", "<think>a < b\nso</think>\n<answer>42</answer>\n") == 1.0
    assert answer_format("p", "<answer>42</answer>") == 0.0
    assert answer_format("p", "<think>x</think><answer>1</answer> trailing") == 0.0
    assert answer_format("p", "<think>x</think><answer>1</answer><answer>2</answer>") == 0.0
    assert answer_format("p", "<think><think>x</think><answer>1</answer>") == 0.0


def test_answer_format_custom_pattern():
    pattern = r"\s*<answer>\d+</answer>\s*"
    assert answer_format("p", " <answer>125</answer>\n", pattern=pattern) == 1.0
    assert answer_format("p", "<answer>12a</answer>", pattern=pattern) == 0.0


@pytest.mark.parametrize("tokens,expected", [(0, 0.0), (100, 0.0), (125, -0.25), (150, -0.5), (200, -1.0), (900, -1.0)])
def test_length_penalty_is_dapos_overlong_penalty(tokens, expected):
    assert length_penalty("p", "c", completion_tokens=tokens, soft_length=100, max_length=200) == expected


def test_every_builtin_loads_with_its_kind():
    kinds = {name: reward_kind(load_reward(name)) for name in BUILTIN_REWARDS}
    assert kinds == {
        "exact_answer": "inline", "math_answer": "sample", "answer_format": "sample",
        "length_penalty": "inline", "unit_tests": "sample", "reward_model": "batched", "env_reward": "async",
    }


def functions(*entries: str) -> list[str]:
    return [f"reward.functions=[{', '.join(entries)}]", "reward.accuracy_from=exact_answer"]


def test_options_reach_the_config():
    config = load_config(None, functions(
        "{name: exact_answer}",
        "{name: length_penalty, weight: 0.5, kwargs: {soft_length: 100, max_length: 200}}",
        r"{name: answer_format, kwargs: {pattern: '<answer>\d+</answer>'}}",
        "{name: unit_tests, kwargs: {timeout_s: 2.0}}",
        "{name: reward_model, kwargs: {path: org/some-reward-model, batch_size: 4}}",
    ))
    assert [f.kwargs for f in config.reward.functions][1:3] == [
        {"soft_length": 100, "max_length": 200}, {"pattern": r"<answer>\d+</answer>"},
    ]


@pytest.mark.parametrize(
    "entry,message",
    [
        ("{name: answer_format, kwargs: {patern: x}}", "unknown option(s) ['patern']"),
        ("{name: answer_format, kwargs: {pattern: '('}}", "not a regular expression"),
        ("{name: length_penalty}", "needs the options soft_length and max_length"),
        ("{name: length_penalty, kwargs: {soft_length: 300, max_length: 200}}", "soft_length < max_length"),
        ("{name: length_penalty, kwargs: {soft_length: a, max_length: 200}}", "option soft_length='a'"),
        ("{name: unit_tests, kwargs: {timeout_s: 0}}", "timeout_s > 0"),
        ("{name: reward_model}", "needs the option path"),
        ("{name: reward_model, kwargs: {path: ./no/such/model}}", "not a model folder and not a hub id"),
        ("{name: exact_answer}", "distinct names"),
    ],
)
def test_bad_options_fail_in_the_config(entry, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, functions("{name: exact_answer}", entry))
    assert message in str(error.value)
