"""Resuming as the issue asks: 6 steps straight versus 3 steps, kill -9 of the driver, resume, 3 more.

Sync mode: the same prompts in the same order, the same completions, the same final weights.
Async mode (stopped by SIGTERM this time): the same prompts in the same order, and it completes.
Sync mode with dynamic sampling: exact too (the extra rounds' prompts come from the restored cursor).
Every run is a `python -m grpo_dist.launch` in a session of its own, on its own local cluster.
"""

import json
import os
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file

from faults import kill_session, session_processes
from runs import SMALL, finish, start, train_records, wait_for

RUN = [*SMALL, "trainer.steps=6", "trainer.checkpoint_every=3", "trainer.samples_every=1", "trainer.samples_per_log=8"]


def samples(run_dir: Path) -> dict[int, list]:
    """Per step: every prompt's index with its completions, in the order the step had them."""
    steps: dict[int, list] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], []).append((record["prompt_index"], [c["text"] for c in record["completions"]]))
    return steps


def max_weight_difference(a: Path, b: Path) -> float:
    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert left.keys() == right.keys()
    return max((left[name] - right[name]).abs().max().item() for name in left)


def kill_9_after(step: int, run_dir: Path, *args: str, timeout: float = 180) -> None:
    """Launch into `run_dir` with `args`; kill -9 its process group once the checkpoint of `step`
    is complete (within `timeout` seconds)."""
    run = start(*args, f"trainer.output_dir={run_dir.parent}", f"trainer.run_name={run_dir.name}")
    try:
        wait_for(lambda: (run_dir / "checkpoints" / f"step_{step:06d}" / "COMPLETE").is_file(), run, timeout)
        os.killpg(run.pid, signal.SIGKILL)  # kill -9 of the driver's process group, a step or two later
        assert run.wait(timeout=30) == -signal.SIGKILL  # (reaped here: kill_session would reap it unseen)
    finally:
        kill_session(run.pid)  # the local cluster's workers, in process groups of their own
    assert not session_processes(run.pid)


def straight_and_resumed(output_dir: Path, kill_after: int, *args: str) -> tuple[Path, Path]:
    """Run `args` straight into output_dir/a, and again into output_dir/b killed with kill -9 after the
    checkpoint of step `kill_after` and resumed; both must exit 0. Returns (a, b)."""
    code, output = finish(start(*args, f"trainer.output_dir={output_dir}", "trainer.run_name=a"))
    assert code == 0, output[-3000:]
    kill_9_after(kill_after, output_dir / "b", *args)
    code, output = finish(start("--resume", str(output_dir / "b")))
    assert code == 0, output[-3000:]
    return output_dir / "a", output_dir / "b"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Run A: 6 steps in sync mode, uninterrupted."""
    out = tmp_path_factory.mktemp("straight")
    code, output = finish(start(*RUN, f"trainer.output_dir={out}", "trainer.run_name=a"))
    assert code == 0, output[-3000:]
    return out / "a"


@pytest.mark.slow
def test_sync_resume_after_kill_9_gives_the_same_prompts_completions_and_weights(straight, tmp_path):
    run_dir = tmp_path / "b"
    kill_9_after(3, run_dir, *RUN)
    assert not (run_dir / "summary.json").exists() and len(train_records(run_dir)) in (3, 4)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["RUN_ID", "step_000003"]

    code, output = finish(start("--resume", str(run_dir)))
    assert code == 0, output[-3000:]

    records, expected = train_records(run_dir), train_records(straight)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # each once: the redone ones replaced
    assert [r["policy/version"] for r in records] == [1, 2, 3, 4, 5, 6]
    for name in ("data/epoch", "data/position", "reward/mean", "loss/total", "policy/grad_norm"):
        assert [r[name] for r in records] == [r[name] for r in expected], name
    assert samples(run_dir) == samples(straight)  # the same prompts in the same order, the same completions
    difference = max_weight_difference(run_dir / "final", straight / "final")
    print(f"sync resume: max |weight difference| = {difference:g}")
    assert difference == 0.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["resumed_from_step"] == 3
    assert summary["eval_accuracy_before"] == json.loads((straight / "summary.json").read_text())["eval_accuracy_before"]


@pytest.mark.slow
def test_async_resume_after_sigterm_keeps_the_prompt_order_and_completes(straight, tmp_path):
    run_dir = tmp_path / "c"
    run = start(*RUN, "trainer.mode=async", "trainer.max_staleness=1", f"trainer.output_dir={tmp_path}",
                "trainer.run_name=c")
    try:
        wait_for(lambda: len(train_records(run_dir)) >= 1, run)
        run.send_signal(signal.SIGTERM)  # the driver alone: it finishes the step, saves, exits 128 + 15
        code, output = finish(run, timeout=120)
    finally:
        kill_session(run.pid)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    step = train_records(run_dir)[-1]["step"]
    assert step < 6 and f"stopped by SIGTERM after step {step}; the last checkpoint is " in output
    assert f"resume with: python -m grpo_dist.launch --resume {run_dir}" in output
    state = json.loads((run_dir / "checkpoints" / f"step_{step:06d}" / "trainer_state.json").read_text())
    assert len(state["in_flight"]) == min(2, 6 - step)  # batches step+1, step+2 were drawn, not trained

    code, output = finish(start("--resume", str(run_dir)))
    assert code == 0, output[-3000:]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    expected = train_records(straight)
    for name in ("data/epoch", "data/position"):
        assert [r[name] for r in records] == [r[name] for r in expected], name
    assert [[index for index, _ in prompts] for prompts in samples(run_dir).values()] == [
        [index for index, _ in prompts] for prompts in samples(straight).values()]
    assert max(r["rollout/staleness_max"] for r in records) <= 1
    print(f"async resume after step {step}: max |weight difference| from sync = "
          f"{max_weight_difference(run_dir / 'final', straight / 'final'):g}")


@pytest.mark.slow
def test_sync_resume_with_dynamic_sampling_is_exact_too(tmp_path):
    """Extra rounds draw from the cursor after the step's batch: restored at the same point."""
    dynamic = [*SMALL, "trainer.steps=4", "trainer.checkpoint_every=2", "algo.dynamic_sampling=true",
               "algo.dynamic_sampling_max_rounds=3"]
    straight, resumed = straight_and_resumed(tmp_path, 2, *dynamic)
    records, expected = train_records(resumed), train_records(straight)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert max(r["rollout/dynamic_rounds"] for r in expected) > 1, "no step needed a second round"
    for name in ("data/epoch", "data/position", "rollout/dynamic_rounds", "rollout/dynamic_groups", "reward/mean"):
        assert [r[name] for r in records] == [r[name] for r in expected], name
    difference = max_weight_difference(resumed / "final", straight / "final")
    print(f"sync resume with dynamic sampling: max |weight difference| = {difference:g}")
    assert difference == 0.0
