"""RewardWorker: batched and async rewards, failure accounting, and serving after adversarial programs."""

import os
import signal
import time
from pathlib import Path

import pytest
import ray

import reward_helpers

from grpo_dist.config.schema import load_config
from grpo_dist.reward.pool import OUTPUT_LIMIT
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.common.types import Completion, Group
from test_code_sandbox import sandbox_processes

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
ADD = "```python\ndef add(a, b):\n    return a + b\n```"
ADVERSARIAL = [
    "while True:\n    pass",  # infinite loop
    "import time\ntime.sleep(10**6)",  # sleep forever
    "import os\nwhile True:\n    os.fork()",  # fork bomb
    "x = bytearray(1 << 40)",  # memory bomb
    "import os\nos._exit(0)",  # exit before the tests
    "import sys\ndef add(a, b):\n    return 0\nprint('ok 0\\nok 1\\ndone')\nsys.exit(0)",  # forged pass
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",  # kill its parent
]


def group(texts: list[str], **row) -> Group:
    completions = [Completion(list(range(len(t))), [0.0] * len(t), t, "stop") for t in texts]
    return Group(prompt_index=0, row={"prompt": "p", **row}, prompt="p", prompt_ids=[], completions=completions, policy_version=0)


def worker(accuracy_from: str, *entries: str, **settings) -> RewardWorker:
    """A RewardWorker for the reward functions `entries` (YAML) and reward.`settings`."""
    overrides = [f"reward.functions=[{', '.join(entries)}]", f"reward.accuracy_from={accuracy_from}"]
    return RewardWorker(load_config(None, overrides + [f"reward.{k}={v}" for k, v in settings.items()]).reward)


def unit_test_worker() -> RewardWorker:
    return worker("unit_tests", "{name: unit_tests, kwargs: {timeout_s: 1.0}}", processes=2, timeout_s=5)


@pytest.mark.timeout(60)
def test_adversarial_programs_score_zero_and_the_worker_keeps_serving():
    reward = unit_test_worker()
    try:
        start = time.monotonic()
        [scored], failures = reward.score([group(ADVERSARIAL, tests=ADD_TESTS)])
        assert scored.rewards == [0.0] * len(ADVERSARIAL)
        assert failures == {"reward/unit_tests/failures": 0.0}  # the sandbox reported each run
        assert time.monotonic() - start < 15  # two 1 s timeouts at a time, the rest quick
        [good], failures = reward.score([group([ADD, "def add(a, b):\n    return 3"], tests=ADD_TESTS)])
        assert good.rewards == [1.0, 0.5] and failures == {"reward/unit_tests/failures": 0.0}
    finally:
        reward.close()
    assert sandbox_processes() == []


def test_weighted_sum_and_parts_per_function():
    reward = worker(
        "exact_answer",
        "{name: exact_answer}",
        "{name: length_penalty, weight: 0.5, kwargs: {soft_length: 2, max_length: 4}}",
        "{name: 'reward_helpers:batched_length', kwargs: {scale: 2.0}}",
    )
    try:
        [scored], failures = reward.score([group(["<answer>3</answer>", "<answer>4</answer>x"], answer="3")])
    finally:
        reward.close()
    # completion_tokens = len(text): 18 and 19 tokens, both past max_length -> penalty -1
    assert scored.reward_parts == {
        "exact_answer": [1.0, 0.0], "length_penalty": [-1.0, -1.0], "reward_helpers:batched_length": [36.0, 38.0],
    }
    assert scored.rewards == [1.0 - 0.5 + 36.0, 0.0 - 0.5 + 38.0]
    assert set(failures.values()) == {0.0}


@pytest.mark.parametrize(
    "texts,values,failed",
    [
        (["ab", "boom", "c"], [-1.0] * 3, (3, "exception: RuntimeError: boom")),  # raises: the whole batch fails
        (["ab", "short", "c"], [-1.0] * 3, (3, "exception: ValueError: returned 2 scores for 3 samples")),
        (["ab", "nan", "c"], [2.0, -1.0, 1.0], (1, "non-finite: nan")),  # NaN: that sample fails
    ],
)
def test_a_failing_batched_reward_costs_its_batch_not_the_run(texts, values, failed):
    name = "reward_helpers:batched_length"
    reward = worker(name, f"{{name: '{name}'}}", failure_score=-1.0)
    [scored], failures = reward.score([group(texts)])
    assert scored.reward_parts[name] == values
    assert failures == {f"reward/{name}/failures": float(failed[0]), f"reward/{name}/first_error": failed[1]}
    [scored], failures = reward.score([group(["xyz"])])
    assert scored.rewards == [3.0] and failures[f"reward/{name}/failures"] == 0.0


def test_an_inline_reward_runs_in_the_actor_and_a_failure_costs_its_sample():
    """@inline: called in the reward actor's own process (no scoring pool is started for it),
    and a sample whose call raises gets failure_score alone; exact_answer is inline."""
    name = "reward_helpers:inline_digits"
    reward = worker(name, f"{{name: '{name}'}}", "{name: exact_answer}", failure_score=-1.0)
    assert reward.pool is None and reward.kinds == {name: "inline", "exact_answer": "inline"}
    reward_helpers.PIDS.clear()
    [scored], failures = reward.score([group(["2.5", "two", "<answer>7</answer>"], answer="7")])
    assert scored.reward_parts == {name: [2.5, -1.0, -1.0], "exact_answer": [0.0, 0.0, 1.0]}
    assert failures == {f"reward/{name}/failures": 2.0, "reward/exact_answer/failures": 0.0,
                        f"reward/{name}/first_error": "exception: ValueError: could not convert string to float: 'two'"}
    assert reward_helpers.PIDS == {os.getpid()}


@pytest.mark.timeout(30)
def test_an_inline_reward_that_hangs_costs_its_sample_and_moves_into_the_scoring_pool():
    """A sync sleep and a Python loop past reward.timeout_s: each costs its sample at the deadline.
    After the first, the reward is scored in the pool (where the second is killed), for good."""
    name = "reward_helpers:inline_hangs"
    reward = worker(name, f"{{name: '{name}'}}", timeout_s=0.5, failure_score=-1.0)
    try:
        start = time.monotonic()
        [scored], failures = reward.score([group(["1", "spin 3", "2", "sleep 3", "3"])])
        assert scored.rewards == [1.0, -1.0, 2.0, -1.0, 3.0]
        assert failures == {f"reward/{name}/failures": 2.0, f"reward/{name}/first_error": "timeout"}
        assert time.monotonic() - start < 5  # two deadlines and the pool's start, not 6 s of hangs
        assert reward.kinds[name] == "sample" and len(reward.pool.worker_pids) == 1
        [scored], _ = reward.score([group(["4", "sleep 3"])])
        assert scored.rewards == [4.0, -1.0]
    finally:
        reward.close()


@pytest.mark.timeout(30)
def test_a_batched_reward_that_hangs_fails_its_batch_and_the_calls_while_it_has_not_returned():
    name = "reward_helpers:batched_hangs"
    reward = worker(name, f"{{name: '{name}'}}", batch_timeout_s=0.5, failure_score=-1.0)
    start = time.monotonic()
    [scored], failures = reward.score([group(["sleep 1.5", "ab"])])
    assert scored.rewards == [-1.0, -1.0] and failures[f"reward/{name}/first_error"] == "timeout"
    assert time.monotonic() - start < 1.2
    [scored], failures = reward.score([group(["abc"])])  # at once: the stuck call still runs
    assert scored.rewards == [-1.0] and time.monotonic() - start < 1.2
    assert failures[f"reward/{name}/first_error"] == "timeout: its call past reward.batch_timeout_s has not returned"
    reward.stuck[name].join(5)
    [scored], failures = reward.score([group(["abc", "de"])])  # it returned: the reward scores again
    assert scored.rewards == [3.0, 2.0] and failures == {f"reward/{name}/failures": 0.0}


@pytest.mark.parametrize("kind", ["inline", "async", "batched"])
def test_what_a_reward_in_the_actor_prints_is_cut_as_the_scoring_pools_is(kind, capfd):
    """1 MiB to stdout and to stderr per sample, 3 samples: the first 64 KiB of each stream per
    function and chunk reach the actor's log, then one line says so; the scores are as usual."""
    name = f"reward_helpers:{kind}_prints"
    reward = worker(name, f"{{name: '{name}'}}")
    [scored], failures = reward.score([group(["a", "b", "c"])])
    print("after")
    out, err = capfd.readouterr()
    assert scored.rewards == [1.0] * 3 and failures == {f"reward/{name}/failures": 0.0}
    assert out.count("x") == err.count("y") == OUTPUT_LIMIT
    assert out.count("[reward output cut at 65536 characters]") == err.count("[reward output cut at") == 1
    assert out.endswith("after\n")  # the actor's own streams are back


def test_a_batched_class_is_built_once_with_its_options():
    reward = worker("reward_helpers:Counter", "{name: 'reward_helpers:Counter', kwargs: {start: 10}}")
    assert reward.score([group(["a", "b"]), group(["c"])])[0][1].rewards == [11.0]
    assert reward.score([group(["d"])])[0][0].rewards == [12.0]


@pytest.mark.timeout(30)
def test_async_rewards_run_concurrently_each_under_the_deadline():
    reward = worker("reward_helpers:async_sleep", "{name: 'reward_helpers:async_sleep'}", timeout_s=0.5)
    start = time.monotonic()
    [scored], failures = reward.score([group(["0.3", "0.3", "0.3", "60", "x"])])
    assert time.monotonic() - start < 0.9  # together, not one after another
    assert scored.rewards == [0.3, 0.3, 0.3, 0.0, 0.0]
    assert failures == {"reward/reward_helpers:async_sleep/failures": 2.0,  # the timeout and the ValueError
                        "reward/reward_helpers:async_sleep/first_error": "timeout"}


@pytest.mark.timeout(30)
def test_an_async_reward_that_blocks_its_event_loop_still_meets_the_deadline():
    """A sync sleep of 3 s in an async reward: asyncio.wait_for on that loop could not fire until
    it returned; the coroutines run on a loop of their own, so each sample fails at 0.5 s (the
    other one too: it waits behind the blocked loop)."""
    name = "reward_helpers:async_blocks"
    reward = worker(name, f"{{name: '{name}'}}", timeout_s=0.5)
    start = time.monotonic()
    [scored], failures = reward.score([group(["3", "0"])])
    assert time.monotonic() - start < 2
    assert failures == {f"reward/{name}/failures": 2.0, f"reward/{name}/first_error": "timeout"}


def actor_pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


@pytest.mark.timeout(180)
def test_a_restarted_reward_actor_keeps_the_sandbox(ray_cluster):
    """kill -9 of a RewardWorker actor: Ray builds it again (as the trainer asks: max_restarts,
    no task retries), and the new one scores hostile programs with the sandbox's guarantees."""
    config = load_config(None, ["reward.functions=[{name: unit_tests, kwargs: {timeout_s: 1.0}}]",
                                "reward.accuracy_from=unit_tests", "reward.processes=2", "reward.timeout_s=5"])
    actor = ray.remote(RewardWorker).options(max_restarts=1, max_task_retries=0, num_cpus=0.5).remote(config.reward)
    try:
        old = actor_pid(actor)
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while True:  # calls fail while the actor is down; then it answers from a new process
            try:
                new = actor_pid(actor)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                assert time.monotonic() < deadline, "the reward actor did not come back"
                time.sleep(0.5)
        assert new != old
        [scored], failures = ray.get(actor.score.remote([group(ADVERSARIAL, tests=ADD_TESTS)]), timeout=60)
        assert scored.rewards == [0.0] * len(ADVERSARIAL) and failures == {"reward/unit_tests/failures": 0.0}
        [good], _ = ray.get(actor.score.remote([group([ADD, "def add(a, b):\n    return 3"], tests=ADD_TESTS)]),
                            timeout=60)
        assert good.rewards == [1.0, 0.5]
        assert sandbox_processes() == []
    finally:
        ray.get(actor.close.remote(), timeout=60)
        ray.kill(actor, no_restart=True)


def test_a_batch_where_every_sample_failed_is_told_with_its_first_error():
    """chunk_stats.every_sample_failed over a batch's chunks, and the message that ends the run
    after trainer.max_bad_steps such steps (tests/test_recovery.py runs it end to end)."""
    from grpo_dist.controller.errors import NOT_FINITE, TooManyBadSteps
    from grpo_dist.reward.chunk_stats import every_sample_failed

    stats = [{"completions": 4.0, "reward/f/failures": 4.0, "reward/f/first_error": "exception: boom",
              "reward/g/failures": 0.0},
             {"completions": 4.0, "reward/f/failures": 4.0, "reward/f/first_error": "timeout", "reward/g/failures": 1.0,
              "reward/g/first_error": "timeout"}]
    assert every_sample_failed([{}, {}], stats) == "reward function f failed on every sample (8), the first: " \
                                                   "exception: boom"
    stats[1]["reward/f/failures"] = 3.0
    assert every_sample_failed([{}, {}], stats) is None  # one sample scored
    infos = [{"env/episodes": 4.0, "env/failed": 4.0, "first_env_error": "reset: RuntimeError: two\nlines"},
             {"env/episodes": 4.0, "env/failed": 4.0, "first_env_error": "step 1: later"}]
    assert every_sample_failed(infos, stats) == "every episode failed (8), the first: reset: RuntimeError: two lines"
    infos[1]["env/failed"] = 3.0
    assert every_sample_failed(infos, stats) is None
    failed = TooManyBadSteps.of(5, 3, "every episode failed (8), the first: x", Path("run/ckpt/policy"))
    assert str(failed) == "steps 3-5 trained on nothing (trainer.max_bad_steps=3 in a row): every episode failed (8), " \
                          "the first: x"
    assert str(TooManyBadSteps.of(2, 2, NOT_FINITE, Path("p"))).startswith(
        "steps 1-2 had a loss or gradient that is not finite (trainer.max_bad_steps=2 in a row; each was skipped)")
