"""The bundled code task: every reference passes its tests in the sandbox, a stub fails."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_dist.reward.unit_tests import TestReport, run_tests, unit_test_reward
from grpo_dist.reward.pool import ScoringPool
from grpo_dist.tasks.code import load_problems

PROBLEMS = load_problems()
FIELDS = {"id", "prompt", "tests", "reference", "entry_point"}


def stub(entry_point: str) -> str:
    """A wrong solution: the right name, returning None."""
    return f"def {entry_point}(*args, **kwargs):\n    return None\n"


def run_all(programs: list[str]) -> list[TestReport]:
    """run_tests for each program against its problem's tests, two at a time."""
    def run(program: str, problem: dict) -> TestReport:
        return run_tests(program, problem["tests"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(run, programs, PROBLEMS))


def test_rows_are_well_formed() -> None:
    assert len(PROBLEMS) >= 30
    assert len({p["id"] for p in PROBLEMS}) == len(PROBLEMS)
    for problem in PROBLEMS:
        assert set(problem) == FIELDS, problem["id"]
        assert problem["tests"] and all(isinstance(t, str) for t in problem["tests"])
        assert f"def {problem['entry_point']}(" in problem["reference"]
        assert problem["entry_point"] in problem["prompt"]


@pytest.mark.timeout(120)
def test_every_reference_passes_all_its_tests() -> None:
    reports = run_all([p["reference"] for p in PROBLEMS])
    failures = {p["id"]: r for p, r in zip(PROBLEMS, reports) if r.status != "passed"}
    assert failures == {}


@pytest.mark.timeout(120)
def test_a_stub_fails_at_least_one_test_of_every_problem() -> None:
    reports = run_all([stub(p["entry_point"]) for p in PROBLEMS])
    lenient = [p["id"] for p, r in zip(PROBLEMS, reports) if r.passed == r.total]
    assert lenient == []
    assert all(r.status == "failed" for r in reports)


@pytest.mark.timeout(30)
def test_reward_of_a_markdown_answer() -> None:
    problem = PROBLEMS[0]
    completion = f"Here is my solution.\n\n```python\n{problem['reference']}```\n"
    fields = {key: value for key, value in problem.items() if key != "prompt"}
    assert unit_test_reward(problem["prompt"], completion, **fields) == 1.0


@pytest.mark.timeout(60)
def test_reward_through_the_scoring_pool() -> None:
    problems = PROBLEMS[:3]
    answers = [f"```python\n{p['reference']}```" for p in problems]
    answers += [stub(p["entry_point"]) for p in problems]
    items = [(p["prompt"], text, {"tests": p["tests"]}) for p, text in zip(problems * 2, answers)]
    with ScoringPool(num_workers=2, timeout_s=10) as pool:
        outcomes = pool.score("grpo_dist.reward.unit_tests:unit_test_reward", items)
    assert [o.error for o in outcomes] == [None] * 6
    assert [o.value for o in outcomes[:3]] == [1.0] * 3
    assert all(o.value < 1.0 for o in outcomes[3:])
