"""A disk that fills up while a checkpoint is written: a small tmpfs as the run's disk.

The previous checkpoint stays whole and loadable, the failed save leaves no staging folder (its
space is given back), the next save works once there is room, and a launched run ends with exit 1
and one line naming the last checkpoint and the resume command. Mounting needs root (CAP_SYS_ADMIN):
elsewhere these tests are skipped with that reason.
"""

import contextlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from grpo_dist.config.schema import Config, load_config
from grpo_dist.controller.checkpoints import SaveFailed, TrainerState, checkpoints, save_checkpoint, step_dir
from grpo_dist.controller.resume import Checkpoint, resume_hint
from grpo_dist.controller.errors import OutputFailed
from grpo_dist.launch import parse_args, plan_run
from grpo_dist.observe.metrics import MetricsLog, TensorBoardSink
from grpo_dist.common.types import Completion, Group
from runs import SMALL, finish, start


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """A tmpfs of `size` mounted at `folder`, unmounted after (skip where mounting is not permitted)."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def learner_writing(size: int):
    """A stand-in for the learner's share writing `size` bytes (a write past the disk's room raises ENOSPC)."""
    def save(folder: Path) -> None:
        (folder / "policy").mkdir()
        (folder / "policy" / "model.safetensors").write_bytes(os.urandom(size))
    return save


def state(step: int) -> TrainerState:
    return TrainerState(step=step, policy_version=step, cursor={"seed": 0, "epoch": 0, "position": 8 * step,
                                                                "rows": 100})


def free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


@pytest.mark.parametrize("filled_by", ["learners_share", "drivers_share"])
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_leaves_nothing(filled_by, tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = disk / "run"
        first = save_checkpoint(run, state(1), Config(), learner_writing(200_000), keep=2)
        before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
        if filled_by == "drivers_share":  # a log as large as the room left: its copy into the checkpoint fails
            (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n' * 16_000)
        free = free_bytes(disk)
        big = 2_000_000 if filled_by == "learners_share" else 100_000
        with pytest.raises(SaveFailed, match=r"could not save the checkpoint of step 2 in .*No space left on device"):
            save_checkpoint(run, state(2), Config(), learner_writing(big), keep=2)

        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["RUN_ID", "step_000001"]  # no staging
        assert free_bytes(disk) == free  # its space given back
        assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
        assert Checkpoint.load(first).state == state(1)  # sizes and sha256 as saved
        assert resume_hint(run).startswith(f"the last checkpoint is {first} (step 1); resume with: ")
        (run / "metrics.jsonl").unlink(missing_ok=True)
        save_checkpoint(run, state(2), Config(), learner_writing(200_000), keep=2)  # room again: it saves
        assert [p.name for p in checkpoints(run)] == ["step_000001", "step_000002"]


@pytest.mark.slow
def test_a_run_whose_disk_fills_exits_1_with_the_resume_command_at_a_checkpoint_and_at_its_logs(tmp_path):
    """The default task, small: each checkpoint is about 10.3 MB, so a 16 MiB disk holds the
    first and not the second. Then the run resumed with its samples.jsonl made /dev/full (every
    write: ENOSPC): its first samples end it the same way, the checkpoint untouched."""
    with tmpfs(tmp_path / "disk", "16m") as disk:
        run_dir = disk / "run"
        code, output = finish(start(*SMALL, "trainer.steps=3", "trainer.checkpoint_every=1", "trainer.save_final=false",
                                    f"trainer.output_dir={disk}", "trainer.run_name=run"), timeout=180)
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        assert code == 1 and len(errors) == 1, output[-3000:]
        assert "save_state at step 2" in errors[0] and "No space left on device" in errors[0], errors[0]
        assert errors[0].endswith(f"the last checkpoint is {step_dir(run_dir, 1)} (step 1); resume with: "
                                  f"python -m grpo_dist.launch --resume {run_dir}"), errors[0]
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["RUN_ID", "step_000001"]
        assert Checkpoint.load(step_dir(run_dir, 1)).state.step == 1
        plan = plan_run(parse_args(["--resume", str(run_dir)]))  # a later resume does not trip on anything
        assert plan.checkpoint.path == step_dir(run_dir, 1)

        (run_dir / "samples.jsonl").symlink_to("/dev/full")
        before = {p: p.read_bytes() for p in step_dir(run_dir, 1).rglob("*") if p.is_file()}
        code, output = finish(start("--resume", str(run_dir), "trainer.samples_every=1"), timeout=180)
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        assert code == 1 and len(errors) == 1 and "Traceback" not in output, output[-3000:]
        assert errors[0] == (f"error: could not write {run_dir / 'samples.jsonl'}: [Errno 28] No space left on device; "
                             f"the last checkpoint is {step_dir(run_dir, 1)} (step 1); resume with: "
                             f"python -m grpo_dist.launch --resume {run_dir}"), errors[0]
        assert {p: p.read_bytes() for p in step_dir(run_dir, 1).rglob("*") if p.is_file()} == before
        assert [p.name for p in checkpoints(run_dir)] == ["step_000001"]


def fill(disk: Path) -> None:
    """Write into disk/filler until the disk is full (a file's last page may keep a few bytes of room)."""
    with (disk / "filler").open("wb", buffering=0) as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(bytes(1 << 16))
    assert os.statvfs(disk).f_bavail == 0


MANY = {f"reward/part_{n}": float(n) for n in range(2000)}  # a record larger than a page's room


@pytest.mark.parametrize("what", ["metrics", "samples"])
def test_a_full_disk_under_the_logs_ends_the_run_naming_the_file(what, tmp_path):
    """metrics.jsonl or samples.jsonl on a full disk: OutputFailed (exit 1 in launch, with the resume
    command) naming the file; before, an OSError without it went up through the run as a traceback."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = disk / "run"
        run.mkdir()
        log = MetricsLog(run, load_config(None, ["trainer.progress=false", "trainer.samples_per_log=1"]))
        log.log(1, {"reward/mean": 0.5})
        fill(disk)
        path = run / f"{what}.jsonl"
        with pytest.raises(OutputFailed, match=f"could not write {re.escape(str(path))}: .*No space left on device"):
            if what == "metrics":
                log.log(2, MANY)
            else:
                log.log_samples(2, [Group(0, {"prompt": "p"}, "p", [], [Completion([1] * 9, [0.0] * 9, "x" * 9000, "stop")
                                                                       ] * 2, 0, rewards=[0.0, 1.0], reward_parts={})])
        log.close()
        assert log.failed


def test_tensorboard_on_a_full_disk_ends_the_run_naming_its_folder(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        sink = TensorBoardSink(disk)
        sink.scalars("train", 1, {"reward/mean": 0.5})
        fill(disk)
        with pytest.raises(OutputFailed, match=f"could not write {re.escape(str(disk / 'tensorboard'))}: .*No space"):
            sink.scalars("train", 2, MANY)
        with pytest.raises(OutputFailed):
            sink.close()
