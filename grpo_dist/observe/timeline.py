"""Where a run's seconds go outside its steps: from the command to the first optimizer step,
and from the last step's final evaluation to exit.

The clock starts when the process did (the command, interpreter start and imports included).
Phases are named spans measured in the driver; they go to the run's log (one line each for
start and end) and to summary.json under "timeline".
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def process_started() -> float:
    """Unix time at which this process started, to Linux's clock tick (10 ms): its start
    (/proc/self/stat field 22, ticks since boot) against the boot clock. psutil's create_time
    adds the boot time, which Linux gives in whole seconds, so it is up to 1 s early (0.9 s
    on this project's machine). Elsewhere psutil's; now when neither can be read."""
    try:
        ticks_after_boot = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks_after_boot / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        pass
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 (a sandbox without /proc: count from the first call)
        return time.time()


class Timeline:
    """Named phases (seconds, in the order they ran) of a run's start and of its end, and marks
    (seconds since the process started) such as the first optimizer step."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = process_started() if origin is None else origin
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.marks: dict[str, float] = {}
        self.details: dict[str, dict[str, float]] = {}  # e.g. each actor's seconds until it was ready
        self.section: dict[str, float] | None = self.start

    def since_start(self, at: float | None = None) -> float:
        """Seconds from the process start to `at` (unix seconds; default: now)."""
        return (time.time() if at is None else at) - self.origin

    def mark(self, name: str, at: float | None = None) -> None:
        """Record when `name` happened (unix seconds `at`, default now), as seconds since the start."""
        self.marks[name] = round(self.since_start(at), 3)

    def training(self) -> None:
        """The steps run from now on: phases are not recorded (the steps have their own metrics)."""
        self.section = None

    def ending(self) -> None:
        """The phases recorded from now on belong to the run's end."""
        self.section = self.end

    def add(self, name: str, seconds: float) -> None:
        if self.section is not None:
            self.section[name] = round(self.section.get(name, 0.0) + seconds, 3)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase `name` of the current section (start or end)."""
        clock = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - clock)

    def first_step(self, step_s: float, optimizer_step_at: float | None) -> str:
        """The first step took `step_s` and its optimizer step ended at `optimizer_step_at` (unix
        seconds): the start is over, the steps begin; returns the start's line for the log."""
        self.add("first_step", step_s)
        self.mark("first_optimizer_step", optimizer_step_at)
        self.training()
        return f"{self.line('start', self.start)}; first optimizer step {self.marks['first_optimizer_step']:.2f} s " \
               "after the command"

    def exit(self) -> dict[str, Any]:
        """The summary at exit: with the seconds from the final evaluation's end to now."""
        self.mark("exit")
        if "final_eval_done" in self.marks:
            self.details["exit_after_final_eval_s"] = round(self.marks["exit"] - self.marks["final_eval_done"], 3)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """What summary.json holds under "timeline"."""
        return {"start_s": dict(self.start), "end_s": dict(self.end), **{f"{k}_s": v for k, v in self.marks.items()},
                **self.details}

    @staticmethod
    def line(title: str, phases: dict[str, float]) -> str:
        """`phases` in one line for the log, e.g. "start: ray_start 1.9 s, actors 4.1 s (6.0 s)"."""
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items())
        return f"{title}: {parts} ({sum(phases.values()):.2f} s)"
