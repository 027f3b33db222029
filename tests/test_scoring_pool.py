"""ScoringPool: outcomes, deadlines, dead workers, parallelism and clean shutdown."""

import multiprocessing
import os
import time

import pytest

from grpo_dist.reward.pool import OUTPUT_LIMIT, ScoreOutcome, ScoringPool

HELPERS = "scoring_helpers"


def _warm_up(pool: ScoringPool, n: int = 2) -> None:
    """Make sure every worker has booted and imported the helpers."""
    pool.score(f"{HELPERS}:length", [("p", "x", {})] * n)


def _assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.timeout(60)
def test_values_in_item_order_with_fields() -> None:
    with ScoringPool(num_workers=2, timeout_s=5) as pool:
        items = [("p", "a" * n, {"scale": 0.5}) for n in range(6)]
        outcomes = pool.score(f"{HELPERS}:length", items)
    assert outcomes == [ScoreOutcome(0.5 * n) for n in range(6)]


@pytest.mark.timeout(60)
def test_exceptions_and_bad_specs_become_outcomes() -> None:
    with ScoringPool(num_workers=1, timeout_s=5) as pool:
        [raised] = pool.score(f"{HELPERS}:raises", [("p", "zz", {})])
        [missing] = pool.score("no_such_module_xyz:f", [("p", "c", {})])
        [ok] = pool.score(f"{HELPERS}:length", [("p", "abc", {})])
    assert raised == ScoreOutcome(None, "exception: ValueError: bad completion 'zz'")
    assert missing.value is None and missing.error.startswith("exception: ModuleNotFoundError")
    assert ok == ScoreOutcome(3.0)


@pytest.mark.timeout(60)
def test_non_finite_values_are_errors() -> None:
    with ScoringPool(num_workers=2, timeout_s=5) as pool:
        items = [("p", text, {}) for text in ["nan", "inf", "-inf", "2.5"]]
        outcomes = pool.score(f"{HELPERS}:non_finite", items)
    errors = ["non-finite: nan", "non-finite: inf", "non-finite: -inf", None]
    assert [o.error for o in outcomes] == errors
    assert outcomes[3].value == 2.5


@pytest.mark.timeout(60)
def test_none_text_and_numbers_beyond_float32_are_errors() -> None:
    """The learner's advantages are float32: a score beyond its range would be inf there."""
    with ScoringPool(num_workers=1, timeout_s=5) as pool:
        outcomes = pool.score(f"{HELPERS}:returns", [("p", c, {}) for c in
                                                      ["none", "text", "numeric_text", "huge", "bool", "2.5"]])
    assert outcomes == [ScoreOutcome(None, "not a number: NoneType 'None'"),
                        ScoreOutcome(None, "not a number: str 'good'"), ScoreOutcome(None, "not a number: str '1.5'"),
                        ScoreOutcome(None, "out of range: 1e+39 (beyond float32's 3.403e+38)"), ScoreOutcome(1.0),
                        ScoreOutcome(2.5)]


@pytest.mark.timeout(60)
def test_a_scorer_that_prints_megabytes_still_scores_and_its_output_is_cut(capfd) -> None:
    """4 MiB to stdout and to stderr per sample: each sample's first 64 KiB of each reach the
    worker's output (the reward actor's log, streamed to the console), then one line says so."""
    with ScoringPool(num_workers=1, timeout_s=5) as pool:
        assert pool.score(f"{HELPERS}:prints", [("p", "c", {})] * 2) == [ScoreOutcome(1.0)] * 2
    out, err = capfd.readouterr()
    assert out.count("x") == err.count("y") == 2 * OUTPUT_LIMIT
    assert out.count("[reward output cut at 65536 characters]") == err.count("[reward output cut at") == 2


@pytest.mark.timeout(60)
def test_a_scorer_that_forks_keeps_the_workers_pipe_and_what_it_leaves_ends_with_the_pool() -> None:
    """A forked child that returns as its parent does must not answer on the worker's pipe (the
    scores would shift); a child left sleeping dies with the pool (the worker's process group)."""
    import psutil

    with ScoringPool(num_workers=1, timeout_s=5) as pool:
        outcomes = pool.score(f"{HELPERS}:forks", [("p", "a" * n, {}) for n in range(8)])
        assert outcomes == [ScoreOutcome(float(n)) for n in range(8)]
        assert pool.score(f"{HELPERS}:length", [("p", "abc", {})] * 3) == [ScoreOutcome(3.0)] * 3
        [sleeper] = pool.score(f"{HELPERS}:leaves_a_sleeper", [("p", "c", {})])
        assert psutil.pid_exists(int(sleeper.value))
    deadline = time.monotonic() + 5
    while not gone(int(sleeper.value)):
        assert time.monotonic() < deadline, "the scorer's child outlived the pool"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(60)
def test_hanging_sample_times_out_and_worker_is_replaced() -> None:
    timeout_s = 0.5
    with ScoringPool(num_workers=2, timeout_s=timeout_s) as pool:
        _warm_up(pool)
        before = pool.worker_pids
        start = time.monotonic()
        outcomes = pool.score(
            f"{HELPERS}:sleeps", [("p", "c", {"seconds": s}) for s in (0.1, 1000.0, 0.1, 0.1)]
        )
        elapsed = time.monotonic() - start
        assert outcomes[1] == ScoreOutcome(None, "timeout")
        assert [o.value for o in outcomes[::2]] == [0.1, 0.1]
        assert elapsed < timeout_s + 1.0
        after = pool.worker_pids
        assert len(after) == 2 and len(set(after) & set(before)) == 1
        assert pool.score(f"{HELPERS}:length", [("p", "ab", {})] * 3) == [ScoreOutcome(2.0)] * 3
    _assert_gone(before + after)


@pytest.mark.timeout(60)
def test_forever_sleeping_function_times_out() -> None:
    with ScoringPool(num_workers=1, timeout_s=0.3) as pool:
        _warm_up(pool, 1)
        start = time.monotonic()
        assert pool.score(f"{HELPERS}:hangs", [("p", "c", {})]) == [ScoreOutcome(None, "timeout")]
        assert time.monotonic() - start < 0.3 + 1.0


@pytest.mark.timeout(60)
def test_worker_that_exits_costs_only_its_sample() -> None:
    with ScoringPool(num_workers=2, timeout_s=5) as pool:
        items = [("p", "abc", {})] * 2
        outcomes = pool.score(f"{HELPERS}:exits", [("p", "c", {})])
        outcomes += pool.score(f"{HELPERS}:length", items)
        assert outcomes == [ScoreOutcome(None, "worker died"), ScoreOutcome(3.0), ScoreOutcome(3.0)]
        assert len(pool.worker_pids) == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault, error", [("exit", "worker died"), ("hang", "timeout")])
def test_a_fault_costs_its_sample_and_the_samples_handed_out_with_it_are_still_scored(fault, error) -> None:
    """A worker is handed several samples at a time: those after the faulty one, which its
    process never reached, go to the replacement."""
    completions = ["a" * (n % 7) for n in range(40)]
    completions[1] = completions[22] = fault
    with ScoringPool(num_workers=1, timeout_s=0.5) as pool:
        _warm_up(pool, 1)
        before = pool.worker_pids
        outcomes = pool.score(f"{HELPERS}:obeys", [("p", c, {}) for c in completions])
        assert outcomes[1] == outcomes[22] == ScoreOutcome(None, error)
        assert [outcomes[i].value for i in range(40) if i not in (1, 22)] == \
            [float(len(c)) for i, c in enumerate(completions) if i not in (1, 22)]
        assert len(pool.worker_pids) == 1 and pool.worker_pids != before
    _assert_gone(before)


@pytest.mark.timeout(60)
def test_many_samples_over_two_workers_keep_their_order() -> None:
    with ScoringPool(num_workers=2, timeout_s=5) as pool:
        outcomes = pool.score(f"{HELPERS}:length", [("p", "a" * n, {}) for n in range(300)])
    assert outcomes == [ScoreOutcome(float(n)) for n in range(300)]


@pytest.mark.timeout(60)
def test_workers_run_in_parallel() -> None:
    with ScoringPool(num_workers=2, timeout_s=5) as pool:
        _warm_up(pool)
        start = time.monotonic()
        outcomes = pool.score(f"{HELPERS}:sleeps", [("p", "c", {"seconds": 0.5})] * 4)
        elapsed = time.monotonic() - start
    assert [o.value for o in outcomes] == [0.5] * 4
    assert 1.0 <= elapsed < 1.5


@pytest.mark.timeout(60)
def test_close_leaves_no_child_processes() -> None:
    pool = ScoringPool(num_workers=2, timeout_s=5)
    _warm_up(pool)
    pids = pool.worker_pids
    assert len(pids) == 2
    pool.close()
    _assert_gone(pids)
    assert multiprocessing.active_children() == []
    assert pool.worker_pids == []


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ScoringPool(num_workers=0, timeout_s=1)
    with pytest.raises(ValueError):
        ScoringPool(num_workers=1, timeout_s=0)
