"""Run checkpoints: everything a resume needs, written atomically, the newest few kept.

    RUN_DIR/checkpoints/step_000123/
        policy/ ...           the learner's share (`Learner.save_state`): HF policy, optimizer,
                              scheduler, RNG states, version
        trainer_state.json    the driver's share: step, policy version, data cursor and the
                              batches drawn but not trained yet, counters
        metrics.jsonl         a copy of RUN_DIR/metrics.jsonl as it was at this step
        config.yaml           the resolved config of the run
        COMPLETE              the manifest (every file, its size and sha256, the run's id), written last
    RUN_DIR/checkpoints/RUN_ID  the run's id, which every manifest names (manifest.py)

A checkpoint is written into a hidden staging folder beside its final place and renamed
into place once COMPLETE is on disk, so a crash during the write leaves the previous
checkpoint as it was; the staging leftovers are removed by the next save, and a save that
fails (a full disk) removes its own and ends the run (SaveFailed). Nothing here starts Ray:
the caller passes the learner's save as a function of the staging folder.

Finding, reading and checking a checkpoint for a resume is resume.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from grpo_dist.common.atomic import fsync_dir, replace_folder
from grpo_dist.config.schema import Config, dump_config
from grpo_dist.controller.errors import RunFailed
from grpo_dist.controller.manifest import CheckpointError, run_id, write_manifest

CHECKPOINTS = "checkpoints"
PREFIX = "step_"
TRAINER_STATE = "trainer_state.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"


class SaveFailed(RunFailed):
    """A checkpoint could not be written (a full disk, say): the run ends, the previous one kept."""


@dataclass
class TrainerState:
    """The driver's share of a checkpoint (trainer_state.json)."""

    step: int  # the last completed step; a resume continues at step + 1
    policy_version: int  # the learner's version after that step
    cursor: dict[str, int]  # PromptCursor.state() after every draw so far
    counters: dict[str, float] = field(default_factory=dict)  # restarts, retries, bad steps in a row, ...
    # The batches drawn but not trained yet (async mode: in flight; in sync mode the next
    # one), in step order: {"cursor": the cursor before the draw, "prompts": [Prompt.index]}.
    # The first one's cursor is that of the first prompt not trained on.
    in_flight: list[dict[str, Any]] = field(default_factory=list)


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"{PREFIX}{step:06d}"


def checkpoints(run_dir: Path) -> list[Path]:
    """The step folders of a run, oldest first (staging folders are hidden, so not listed)."""
    folder = run_dir / CHECKPOINTS
    found = [p for p in folder.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def save_checkpoint(run_dir: Path, state: TrainerState, config: Config,
                    save_learner: Callable[[Path], None], keep: int) -> Path:
    """Write a checkpoint of `state.step` atomically; keep the newest `keep` checkpoints up to it.

    `save_learner(folder)` writes the learner's share into the staging folder (for a Ray
    learner: `ray.get(learner.save_state.remote(str(folder)))`; the folder must be on storage
    the learner's node shares with the driver). A write that fails (OSError: a full disk) is
    SaveFailed; then, as after any failure, the staging folder is removed and the others kept.
    Checkpoints of later steps (left by a run resumed from an older one) are not counted or
    pruned: the resumed run replaces each when it saves that step again.
    """
    folder = run_dir / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    remove_leftovers(folder)
    target = step_dir(run_dir, state.step)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=folder))
    try:
        save_learner(staging)
        (staging / TRAINER_STATE).write_text(json.dumps(asdict(state), indent=2) + "\n")
        (staging / CONFIG).write_text(dump_config(config))
        if (run_dir / METRICS).is_file():
            shutil.copyfile(run_dir / METRICS, staging / METRICS)
        write_manifest(staging, run_id(folder))
        replace_folder(staging, target)  # the same step may be saved again (say, on SIGTERM right after a save)
        fsync_dir(folder)
    except OSError as exc:
        raise SaveFailed(f"could not save the checkpoint of step {state.step} in {folder}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # renamed into place unless something failed
    for old in [path for path in checkpoints(run_dir) if step_of(path) <= state.step][:-keep]:
        discard(old)
    return target


def check_shared_storage(run_dir: Path, write: Callable[[Path, str], None]) -> None:
    """CheckpointError unless what `write(path, text)` writes (the learner, on its node) is
    here for the driver to read: the learner writes its share of every checkpoint itself, so
    RUN_DIR must be storage both see. Asked once before step 1, not found at the first save."""
    folder = run_dir / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    token = os.urandom(8).hex()
    probe = folder / f".probe-{token}"
    write(probe, token)
    try:
        seen = probe.read_text() if probe.is_file() else None
    finally:
        probe.unlink(missing_ok=True)
    if seen != token:
        raise CheckpointError(f"the learner cannot write checkpoints where the driver reads them: a file it wrote "
                              f"to {probe} is not there for the driver; put trainer.output_dir on storage that the "
                              "learner's node and the driver's share")


def discard(path: Path) -> None:
    """Delete a checkpoint: hide it by a rename first, so no half-deleted step folder remains."""
    hidden = path.with_name(f".deleting.{path.name}")
    os.rename(path, hidden)
    shutil.rmtree(hidden)


def remove_leftovers(folder: Path) -> None:
    """Delete hidden staging and half-deleted folders left by a crash (one writer per run)."""
    for path in folder.glob(".*"):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
