"""The timeline of a run's start and end (timeline.py): phases, sections, marks."""

import subprocess
import sys
import time

import pytest

from grpo_dist.observe.timeline import Timeline, process_started


def test_the_clock_starts_when_the_process_did():
    """A child's start as it reads it lies between its parent's clock just before and just after
    spawning it (psutil's create_time was 0.9 s early here: Linux gives the boot time in whole seconds)."""
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "from grpo_dist.observe.timeline import process_started; "
                                                    "import time; time.sleep(0.3); print(process_started())"],
                             stdout=subprocess.PIPE, text=True)
    after = time.time()
    started = float(child.communicate(timeout=60)[0])
    assert before - 0.02 <= started <= after + 0.02  # (one clock tick of slack)
    assert Timeline().since_start() >= time.time() - process_started() - 0.01


def test_phases_go_to_the_section_in_progress_and_steps_record_none():
    timeline = Timeline(origin=time.time())
    with timeline.phase("ray_start"):
        time.sleep(0.05)
    with timeline.phase("ray_start"):  # a phase met twice adds up
        time.sleep(0.05)
    timeline.training()
    with timeline.phase("checkpoint"):  # a periodic checkpoint during the steps
        time.sleep(0.01)
    timeline.mark("first_optimizer_step")
    timeline.ending()
    with timeline.phase("checkpoint"):
        time.sleep(0.02)
    summary = timeline.summary()
    assert list(summary["start_s"]) == ["ray_start"] and 0.1 <= summary["start_s"]["ray_start"] < 0.5
    assert list(summary["end_s"]) == ["checkpoint"] and 0.02 <= summary["end_s"]["checkpoint"] < 0.3
    assert 0.1 <= summary["first_optimizer_step_s"] < 1.0


def test_a_phase_that_raises_is_still_counted():
    timeline = Timeline(origin=time.time())
    with pytest.raises(ValueError), timeline.phase("actors"):
        time.sleep(0.02)
        raise ValueError("no actor")
    assert timeline.start["actors"] >= 0.02


def test_the_log_line_lists_the_phases_in_order_and_their_sum():
    line = Timeline.line("start", {"ray_start": 1.5, "actors": 2.25})
    assert line == "start: ray_start 1.50 s, actors 2.25 s (3.75 s)"
