"""Async mode end to end, against sync mode, from what the runs record (metrics.jsonl, samples.jsonl):

- overlap (their unix timestamps): with max_staleness k >= 1 the engines generate batch t + k
  while the learner trains batch t, from step 2 on, where batch t + k waits for the weights of
  step t - 1 (the first ones are generated ahead at once); in sync mode batch t + 1 is generated
  after the learner trained batch t;
- the staleness bound: batch t is sampled by version max(0, t - k - 1) and trained by version
  t - 1, so it is min(t - 1, k) versions old, for k = 1 and k = 2;
- the data order: every mode trains the same prompts in the same steps.

One small run per mode, shared by the tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import small_config
from grpo_dist.controller.run import TrainingRun

pytestmark = pytest.mark.slow

STEPS = 6
PROMPTS_PER_STEP = 16  # a step's stages last ~0.1-0.3 s on 2 busy cores
MODES = {"sync": ("trainer.mode=sync",),
         "async1": ("trainer.mode=async", "trainer.max_staleness=1"),
         "async2": ("trainer.mode=async", "trainer.max_staleness=2")}
BOUND = {"sync": 0, "async1": 1, "async2": 2}


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory) -> dict[str, dict]:
    """Each mode's summary, train records and sample records (every group of every step)."""
    output = tmp_path_factory.mktemp("runs")
    found = {}
    for name, overrides in MODES.items():
        config = small_config(output, "rollout.engine=transformers", f"trainer.steps={STEPS}", "data.eval=null",
                              f"rollout.prompts_per_step={PROMPTS_PER_STEP}", "trainer.samples_every=1",
                              f"trainer.samples_per_log={PROMPTS_PER_STEP}", "trainer.loggers=[jsonl]",
                              "trainer.save_final=false", f"trainer.run_name={name}", *overrides)
        summary = TrainingRun(config, output / name).run()
        found[name] = {"summary": summary, "train": lines(output / name / "metrics.jsonl"),
                       "samples": lines(output / name / "samples.jsonl")}
    return found


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def overlap_s(train: list[dict], learned: int, generated: int) -> float:
    """Seconds during which batch `generated` was generated while the learner trained batch
    `learned` (negative: the gap between them)."""
    learn, generate = train[learned - 1], train[generated - 1]
    return (min(learn["time/learn_ended"], generate["time/generate_ended"])
            - max(learn["time/learn_started"], generate["time/generate_started"]))


def test_async_generates_while_the_learner_trains_and_sync_does_not(runs):
    for name in ("async1", "async2"):
        bound, train = BOUND[name], runs[name]["train"]
        overlaps = [overlap_s(train, step, step + bound) for step in range(2, STEPS - bound + 1)]
        assert len(overlaps) >= 3 and all(seconds > 0 for seconds in overlaps), (name, overlaps)
    sync = runs["sync"]["train"]
    # the weights of step t reach the engines before they generate batch t + 1
    for step in range(1, STEPS):
        assert sync[step]["time/generate_started"] >= sync[step - 1]["time/learn_ended"], step


@pytest.mark.parametrize("name", MODES)
def test_every_trained_batch_is_as_stale_as_the_bound_allows_and_no_more(runs, name):
    bound = BOUND[name]
    train, samples = runs[name]["train"], runs[name]["samples"]
    expected = [min(step - 1, bound) for step in range(1, STEPS + 1)]  # 0, 1, .., bound, bound
    assert [r["rollout/staleness_max"] for r in train] == expected
    assert [r["rollout/staleness_mean"] for r in train] == expected
    # each group: the version its engine reported when it sampled it, against the learner's before the step
    trained_by = {r["step"]: int(r["policy/version"]) - 1 for r in train}
    assert [r["step"] for r in samples] == [step for step in range(1, STEPS + 1) for _ in range(PROMPTS_PER_STEP)]
    assert [trained_by[r["step"]] - r["policy_version"] for r in samples] == [
        lag for lag in expected for _ in range(PROMPTS_PER_STEP)]
    # the engines really served the older weights: their logprobs differ from the learner's
    for record, lag in zip(train, expected):
        assert (record["rollout/logprob_diff_abs_max"] > 1e-3) == (lag > 0), (record["step"], lag)
    assert runs[name]["summary"]["max_staleness"] == bound


def test_every_mode_trains_the_same_prompts_in_the_same_steps(runs):
    def order(name: str) -> list[tuple]:
        train, samples = runs[name]["train"], runs[name]["samples"]
        return [(r["data/epoch"], r["data/position"], [s["prompt_index"] for s in samples if s["step"] == r["step"]])
                for r in train]

    sync = order("sync")
    assert [(epoch, position) for epoch, position, _ in sync] == [
        (0.0, float(PROMPTS_PER_STEP * (step - 1))) for step in range(1, STEPS + 1)]
    assert len({index for _, _, indices in sync for index in indices}) == STEPS * PROMPTS_PER_STEP
    assert order("async1") == sync and order("async2") == sync
