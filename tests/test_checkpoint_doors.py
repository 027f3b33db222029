"""Bad checkpoints fed to `--resume` as a user meets them: a weight file missing or truncated, no
COMPLETE manifest, AdamW's state changed in place (same size), a checkpoint copied in from another
run. `--resume RUN` is exit 2 in one line naming the checkpoint and the file, before a cluster is
looked for; `--resume auto` tells in one line what it skipped and why, and resumes from the newest
checkpoint that loads. Nothing on disk changes (docs/faults.md)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_dist.launch
from grpo_dist.config.schema import load_config
from grpo_dist.controller.checkpoints import TrainerState, save_checkpoint, step_dir
from grpo_dist.controller.resume import Checkpoint
from grpo_dist.launch import main, parse_args, plan_run

ROOT = Path(__file__).resolve().parent.parent


def learner_share(folder: Path) -> None:
    """A stand-in for Learner.save_state with its file names (the learner is not what is tested)."""
    (folder / "policy").mkdir()
    (folder / "policy" / "model.safetensors").write_bytes(os.urandom(4096))
    for name in ("optimizer.pt", "scheduler.pt", "rng.pt"):
        (folder / name).write_bytes(os.urandom(8192))


def make_run(output_dir: Path, name: str, steps: tuple[int, ...]) -> Path:
    config = load_config(None, [f"trainer.output_dir={output_dir}", f"trainer.run_name={name}"])
    for step in steps:
        state = TrainerState(step=step, policy_version=step,
                             cursor={"seed": 0, "epoch": 0, "position": 32 * step, "rows": 9000})
        save_checkpoint(output_dir / name, state, config, learner_share, keep=2)
    return output_dir / name


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def listing(folder: Path) -> dict[str, tuple[float, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime, p.stat().st_size) for p in folder.rglob("*")}


# what is done to the run's newest checkpoint (step 3; step 2 stays good), and what the line says
BREAKS = {
    "weights_missing": (lambda run, other: (step_dir(run, 3) / "policy" / "model.safetensors").unlink(),
                        "step_000003 is incomplete: policy/model.safetensors is missing, the manifest says 4096 bytes"),
    "weights_truncated": (lambda run, other: os.truncate(step_dir(run, 3) / "policy" / "model.safetensors", 100),
                          "step_000003 is incomplete: policy/model.safetensors is 100 bytes, the manifest says 4096"),
    "no_manifest": (lambda run, other: (step_dir(run, 3) / "COMPLETE").unlink(),
                    "step_000003 is incomplete: no COMPLETE manifest"),
    "optimizer_changed_in_place": (lambda run, other: flip_a_byte(step_dir(run, 3) / "optimizer.pt"),
                                   "step_000003 is damaged: optimizer.pt is not what was saved (its sha256 differs"),
    "another_runs_checkpoint": (lambda run, other: shutil.rmtree(step_dir(run, 3)) or shutil.copytree(
        step_dir(other, 3), step_dir(run, 3)), "step_000003 is of another run: its COMPLETE names run "),
}


@pytest.fixture
def broken(request, tmp_path):
    """Run `a` (steps 2 and 3) in tmp_path/out with its step 3 broken as BREAKS[param] says; run
    `other` (same config, steps 1-3) elsewhere."""
    run = make_run(tmp_path / "out", "a", (2, 3))
    other = make_run(tmp_path / "elsewhere", "a", (1, 2, 3))
    action, message = BREAKS[request.param]
    action(run, other)
    return run, message


@pytest.mark.parametrize("broken", list(BREAKS), indirect=True)
def test_resume_run_refuses_a_bad_checkpoint_in_one_line_naming_the_file(broken):
    run, message = broken
    before = listing(run.parent)
    result = subprocess.run([sys.executable, "-m", "grpo_dist.launch", "--resume", str(run)], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1), result.stderr
    assert result.stderr.startswith(f"error: checkpoint {run}/checkpoints/") and message in result.stderr, result.stderr
    assert listing(run.parent) == before  # nothing written, nothing moved
    assert Checkpoint.load(step_dir(run, 2)).state.step == 2  # the older checkpoint is as it was


@pytest.mark.parametrize("broken", list(BREAKS), indirect=True)
def test_resume_auto_says_what_it_skipped_and_takes_the_newest_good_checkpoint(broken, capsys):
    run, message = broken
    before = listing(run.parent)
    plan = plan_run(parse_args(["--resume", "auto", f"trainer.output_dir={run.parent}"]))
    assert plan.checkpoint.path == step_dir(run, 2) and plan.run_dir == run
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: --resume auto: skipped {step_dir(run, 3)}: "), err
    assert message.removeprefix("step_000003 ") in err, err
    assert listing(run.parent) == before


def test_no_good_checkpoint_is_exit_2_before_a_cluster_is_looked_for(tmp_path, capsys, monkeypatch):
    def no_cluster(address):
        raise AssertionError("a cluster was looked for")

    monkeypatch.setattr(grpo_dist.launch, "choose_cluster", no_cluster)
    run = make_run(tmp_path, "a", (2, 3))
    for step in (2, 3):
        flip_a_byte(step_dir(run, step) / "optimizer.pt")
    assert main(["--resume", str(run)]) == 2
    assert capsys.readouterr().err.startswith(f"error: checkpoint {step_dir(run, 3)} is damaged: optimizer.pt ")
    assert main(["--resume", "auto", f"trainer.output_dir={tmp_path}"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[2] for line in lines[:2]] == [f"skipped {step_dir(run, 3)}", f"skipped {step_dir(run, 2)}"]
    assert lines[2:] == [f"error: --resume auto: no run in {tmp_path} has a complete checkpoint"]


def test_a_run_resumed_from_an_older_checkpoint_keeps_what_it_saves(tmp_path):
    """Resumed from step 2 past a damaged step 4 (`--resume auto`), a save of step 3 with
    keep_checkpoints=1 prunes step 2, never step 3 for the damaged one; step 4 stays (for a look)
    until the run saves step 4 again."""
    run = make_run(tmp_path, "a", (2, 4))
    flip_a_byte(step_dir(run, 4) / "optimizer.pt")
    config = load_config(None, [f"trainer.output_dir={tmp_path}", "trainer.run_name=a"])
    state = TrainerState(step=3, policy_version=3, cursor={"seed": 0, "epoch": 0, "position": 96, "rows": 9000})
    save_checkpoint(run, state, config, learner_share, keep=1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["RUN_ID", "step_000003", "step_000004"]
    plan = plan_run(parse_args(["--resume", "auto", f"trainer.output_dir={tmp_path}"]))
    assert plan.checkpoint.path == step_dir(run, 3)


def test_resume_auto_on_the_command_line_prints_one_line_per_skip(tmp_path):
    run = make_run(tmp_path, "a", (2, 3))
    flip_a_byte(step_dir(run, 3) / "optimizer.pt")
    result = subprocess.run([sys.executable, "-m", "grpo_dist.launch", "--resume", "auto",
                             f"trainer.output_dir={tmp_path}", "--print-config"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and f"output_dir: {tmp_path}" in result.stdout, result.stderr
    assert result.stderr == (f"warning: --resume auto: skipped {step_dir(run, 3)}: is damaged: optimizer.pt is not "
                             "what was saved (its sha256 differs from the one in COMPLETE)\n")
