"""A `python -m grpo_dist.launch` run as a subprocess in a session of its own, for the
end-to-end tests of resuming and of failures (tests/test_resume.py, tests/test_recovery.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from faults import kill_session

ROOT = Path(__file__).resolve().parent.parent

# The default task, small: steps of ~0.1 s on 2 CPUs, one local cluster per run.
SMALL = ["rollout.engine=transformers", "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.threads=1",
         "learner.threads=1", "algo.lr=1e-3", "data.eval_rows=4", "cluster.address=local", "cluster.num_cpus=2",
         "trainer.eval_every=0", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.seed=0"]


def start(*args: str, log: Path | None = None) -> subprocess.Popen:
    """Launch with `args`; its output (stdout and stderr) goes to `log` when given, else a pipe.
    A file never fills up: a pipe nobody reads while the run goes on would block it."""
    out = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 (the child holds it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.Popen([sys.executable, "-m", "grpo_dist.launch", *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)


def finish(run: subprocess.Popen, timeout: float = 240, log: Path | None = None) -> tuple[int, str]:
    """Wait for the run, then kill what is left of its session; (exit code, output)."""
    try:
        output, _ = run.communicate(timeout=timeout)
    finally:
        kill_session(run.pid)
    return run.returncode, log.read_text() if log is not None else output


def train_records(run_dir: Path) -> list[dict]:
    """The train records of RUN_DIR/metrics.jsonl (a line being written is left out)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
    return [r for r in (json.loads(line) for line in lines if line.endswith("\n")) if r["kind"] == "train"]


def wait_for(condition: Callable[[], bool], run: subprocess.Popen, timeout: float = 180) -> None:
    """Poll `condition` until it holds; fail when the run ends first or the time is up."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert run.poll() is None, f"the run ended first (exit {run.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
