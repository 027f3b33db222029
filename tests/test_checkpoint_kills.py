"""kill -9 at each phase of a checkpoint write leaves the newest complete checkpoint loadable.

A child process saves step 3 of a run that holds steps 1 and 2 and SIGKILLs itself at one
phase: inside the learner's share (the save callable the caller passes), or on entering or
leaving one of save_checkpoint's own steps (wrapped in the child only; production code has no
hooks). Then `resume_checkpoint` and `--resume auto` must load the newest checkpoint that was
renamed into place, whole (sha256 checked), and the next save must clear what the kill left.
"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_dist.config.schema import Config
from grpo_dist.controller.checkpoints import TrainerState, checkpoints, save_checkpoint, step_dir
from grpo_dist.controller.resume import find_checkpoint, resume_checkpoint

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    import grpo_dist.controller.checkpoints as checkpoints
    from grpo_dist.config.schema import Config

    run_dir, phase = Path(sys.argv[1]), sys.argv[2]

    def die():
        print(phase, flush=True)  # the parent knows the phase was reached
        os.kill(os.getpid(), signal.SIGKILL)

    def learner(folder):
        (folder / "policy").mkdir()
        with (folder / "policy" / "model.safetensors").open("wb") as handle:
            handle.write(os.urandom(50_000))
            handle.flush()
            if phase == "learner_share_half_written":
                die()
        (folder / "optimizer.pt").write_bytes(os.urandom(100_000))

    def on_entering(name):
        setattr(checkpoints, name, lambda *args, **kwargs: die())

    def on_leaving(name):
        original = getattr(checkpoints, name)
        def leave(*args, **kwargs):
            original(*args, **kwargs)
            die()
        setattr(checkpoints, name, leave)

    def on_deleting():
        original = shutil.rmtree
        def rmtree(path, *args, **kwargs):
            if Path(path).name.startswith(".deleting."):
                die()
            original(path, *args, **kwargs)
        shutil.rmtree = rmtree

    def on_moving_the_old_one():  # the target's old folder leaves its name: swapped out, or renamed aside
        import grpo_dist.common.atomic as atomic
        rename, exchange = atomic.os.rename, atomic.exchange
        def renaming(source, target):
            rename(source, target)
            if Path(target).name.startswith(".step_000003.old."):
                die()
        def swapping(first, second):
            swapped = exchange(first, second)
            if swapped:
                die()
            return swapped
        atomic.os.rename, atomic.exchange = renaming, swapping

    if phase == "saving_the_step_again_while_the_old_one_moves":
        first = checkpoints.TrainerState(step=3, policy_version=3,
                                         cursor={"seed": 0, "epoch": 0, "position": 0, "rows": 100})
        checkpoints.save_checkpoint(run_dir, first, Config(), learner, keep=2)
        on_moving_the_old_one()
    {"before_manifest": lambda: on_entering("write_manifest"),
     "after_manifest_before_rename": lambda: on_leaving("write_manifest"),
     "after_rename_before_pruning": lambda: on_entering("discard"),
     "pruning_half_done": on_deleting}.get(phase, lambda: None)()
    state = checkpoints.TrainerState(step=3, policy_version=3,
                                     cursor={"seed": 0, "epoch": 0, "position": 24, "rows": 100})
    checkpoints.save_checkpoint(run_dir, state, Config(), learner, keep=2)
    print("not killed", flush=True)
""")

# phase -> the step a resume continues from, and the visible step folders after the kill
PHASES = {
    "learner_share_half_written": (2, [1, 2]),
    "before_manifest": (2, [1, 2]),
    "after_manifest_before_rename": (2, [1, 2]),
    "after_rename_before_pruning": (3, [1, 2, 3]),
    "pruning_half_done": (3, [2, 3]),
    "saving_the_step_again_while_the_old_one_moves": (3, [2, 3]),  # step 3 saved (position 0), then again
}


def learner(folder: Path) -> None:
    (folder / "policy").mkdir()
    (folder / "policy" / "model.safetensors").write_bytes(os.urandom(50_000))
    (folder / "optimizer.pt").write_bytes(os.urandom(100_000))


def state(step: int) -> TrainerState:
    return TrainerState(step=step, policy_version=step, cursor={"seed": 0, "epoch": 0, "position": 8 * step,
                                                                "rows": 100})


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_kill_at_each_phase_of_a_save_leaves_the_newest_complete_checkpoint_loadable(phase, tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(run, state(step), Config(), learner, keep=2)
    child = subprocess.run([sys.executable, "-c", CHILD, str(run), phase], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (child.returncode, child.stdout) == (-signal.SIGKILL, f"{phase}\n"), child.stderr[-2000:]

    resumes_from, visible = PHASES[phase]
    assert [int(path.name[5:]) for path in checkpoints(run)] == visible
    resumed = resume_checkpoint(run)  # loads: sizes and sha256 checked
    assert resumed.path == step_dir(run, resumes_from) and resumed.state.cursor["position"] == 8 * resumes_from
    skipped = []
    assert find_checkpoint(tmp_path, skipped.append).path == step_dir(run, resumes_from)
    assert skipped == []

    save_checkpoint(run, state(4), Config(), learner, keep=2)  # the next save clears what the kill left
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["RUN_ID", "step_00000{}".format(
        resumes_from), "step_000004"]
