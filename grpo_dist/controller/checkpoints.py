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

A resume (run.py) puts the run's logs back as they were at the checkpoint
(`restore_metrics`), restores the cursor and the batches to draw first (`restore_data`)
and the learner's share (Learner.load_state). Sampling needs no saved state: every
completion's random stream derives from (seed, step, position, sample) (seeding.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from grpo_dist.common.atomic import copy_atomic, fsync_dir, replace_folder
from grpo_dist.config.schema import Config, dump_config
from grpo_dist.controller.errors import RunFailed
from grpo_dist.controller.manifest import (MANIFEST, CheckpointError, check_complete, is_complete, run_id,
                                          write_manifest)
from grpo_dist.tasks.data import PromptCursor
from grpo_dist.common.types import Prompt

CHECKPOINTS = "checkpoints"
PREFIX = "step_"
TRAINER_STATE = "trainer_state.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
CONFIG = "config.yaml"

# Fields that may differ between a checkpoint's config and the resumed run's: how long to
# run, how often to evaluate, save and log, deadlines, where things run, and the evaluation
# set. Every other field decides what is trained, so a resume keeps it (by dotted path or section).
RESUMABLE = (
    "trainer.steps", "trainer.max_wall_seconds", "trainer.eval_every", "trainer.output_dir",
    "trainer.run_name", "trainer.save_final", "trainer.progress", "trainer.checkpoint_every",
    "trainer.keep_checkpoints", "trainer.max_bad_steps", "trainer.verify_weight_sync",
    "trainer.weight_sync", "trainer.weight_sync_timeout_s", "trainer.weight_sync_bucket_mb",
    "trainer.call_timeout_s", "trainer.loggers", "trainer.wandb_project", "trainer.samples_every",
    "trainer.samples_per_log", "cluster", "data.eval", "data.eval_rows",
    # the learner's placement and how it splits a batch (micro-batching is exact); not learner.lora,
    # which decides what is trained (its rank and alpha shape the adapters a checkpoint holds), nor
    # learner.sharding, whose checkpoints differ (fsdp: shards/ that reshard to any learner.num_ranks)
    "learner.num_cpus", "learner.num_gpus", "learner.resources", "learner.node_labels", "learner.num_ranks",
    "learner.threads", "learner.micro_batch_size", "learner.max_tokens_per_micro_batch",
    "learner.gradient_checkpointing", "learner.offload", "learner.share_prompts", "learner.collective_timeout_s",
    "rollout.engine", "rollout.placement", "rollout.num_workers", "rollout.num_cpus",
    "rollout.num_gpus", "rollout.threads", "rollout.vllm",
    "reward.num_workers", "reward.placement", "reward.num_cpus", "reward.num_gpus", "reward.processes",
)


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


@dataclass
class Checkpoint:
    """A complete checkpoint read back: where it is, the driver's state and the config it ran."""

    path: Path
    state: TrainerState
    config: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        check_complete(path)
        try:
            state = TrainerState(**json.loads((path / TRAINER_STATE).read_text()))
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {path} is damaged: {TRAINER_STATE}: {exc}") from None
        try:
            config = yaml.safe_load((path / CONFIG).read_text())
        except yaml.YAMLError as exc:
            raise CheckpointError(f"checkpoint {path} is damaged: {CONFIG}: {str(exc).splitlines()[0]}") from None
        return cls(path, state, config)

    def restore_metrics(self, run_dir: Path) -> list[dict[str, Any]]:
        """Put the checkpoint's metrics.jsonl back, so the run's log continues from this step
        (the records of later steps, which are redone, and a line torn by a kill are gone), and
        cut samples.jsonl back to this step; returns the metrics records."""
        if (self.path / METRICS).is_file():
            copy_atomic(self.path / METRICS, run_dir / METRICS)
        samples = run_dir / SAMPLES
        if samples.is_file():
            kept = [line for line, record in json_lines(samples) if record["step"] <= self.state.step]
            staging = samples.with_name(f".{samples.name}.tmp")
            staging.write_text("".join(kept))
            os.replace(staging, samples)
        return [record for _, record in json_lines(run_dir / METRICS)] if (run_dir / METRICS).is_file() else []

    def restore_data(self, prompts: list[Prompt], seed: int) -> tuple[PromptCursor, list[tuple[dict, list[Prompt]]]]:
        """The data cursor as it was, and the batches drawn but not trained (cursor before the
        draw, prompts), to be drawn first; CheckpointError when this run's data differ."""
        cursor = PromptCursor(prompts, seed)
        try:
            cursor.restore(self.state.cursor)
        except ValueError as exc:
            raise CheckpointError(f"cannot resume from {self.path}: {exc}") from None
        by_index = {prompt.index: prompt for prompt in prompts}
        batches = []
        for batch in self.state.in_flight:
            missing = [index for index in batch["prompts"] if index not in by_index]
            if missing:
                raise CheckpointError(f"cannot resume from {self.path}: its next batches hold rows {missing[:5]}, "
                                      "which this run's training data do not have")
            batches.append((batch["cursor"], [by_index[index] for index in batch["prompts"]]))
        return cursor, batches


def json_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The complete JSON lines of a file, each with its record; a torn last line is left out."""
    lines = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if line.endswith("\n"):
            lines.append((line, record))
    return lines


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"{PREFIX}{step:06d}"


def checkpoints(run_dir: Path) -> list[Path]:
    """The step folders of a run, oldest first (staging folders are hidden, so not listed)."""
    folder = run_dir / CHECKPOINTS
    found = [p for p in folder.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest step folder of a run, complete or not (see `check_complete`)."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


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


def find_checkpoint(output_dir: Path, skipped: Callable[[str], None]) -> Checkpoint:
    """`--resume auto`: the newest checkpoint of any run in `output_dir` that loads (complete, its
    files as saved, of the run it is in); each newer one that does not is told to `skipped`."""
    runs = [run for run in output_dir.iterdir() if run.is_dir()] if output_dir.is_dir() else []
    found = [path for run in runs for path in checkpoints(run)]
    for path in sorted(found, key=lambda path: (saved_at(path), step_of(path)), reverse=True):
        try:
            return Checkpoint.load(path)
        except CheckpointError as exc:
            skipped(f"--resume auto: skipped {path}: {str(exc).replace(f'checkpoint {path} ', '')}")
    raise CheckpointError(f"--resume auto: no run in {output_dir} has a complete checkpoint")


def saved_at(path: Path) -> float:
    """When a checkpoint was finished: its manifest's time (the folder's, without one)."""
    manifest = path / MANIFEST
    return (manifest if manifest.is_file() else path).stat().st_mtime


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def resume_hint(run_dir: Path) -> str:
    """Where a run that stopped can continue from, and the exact command, in words."""
    found = [path for path in checkpoints(run_dir) if is_complete(path, contents=False)]  # sizes: a quick look
    if not found:
        return "no checkpoint was saved yet: start the run again"
    step = step_of(found[-1])
    return f"the last checkpoint is {found[-1]} (step {step}); resume with: python -m grpo_dist.launch --resume {run_dir}"


def resume_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint `--resume RUN_DIR` continues from: the run's newest, which must be complete."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise CheckpointError(f"--resume {run_dir}: no checkpoint in {run_dir / CHECKPOINTS}")
    return Checkpoint.load(latest)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def value(flat: dict[str, Any], key: str) -> Any:
    """A flattened config's value at `key`: a leaf, or the section below it."""
    if key in flat:
        return flat[key]
    return {name[len(key) + 1:]: item for name, item in flat.items() if name.startswith(key + ".")}


def resumable(key: str) -> bool:
    return any(key == name or key.startswith(name + ".") for name in RESUMABLE)


def check_resume_config(saved: dict[str, Any], config: Config) -> None:
    """Raise CheckpointError naming every field that differs from the checkpoint's and may not.

    Fields only one side knows (added or removed by an upgrade) are not compared; a section that
    is null on one side and set on the other (learner.lora turned on or off) is a change.
    """
    old, new = flatten(saved), flatten(config.model_dump(mode="json"))
    changed = [key for key in old.keys() & new.keys() if old[key] != new[key] and not resumable(key)]
    for key in old.keys() ^ new.keys():
        other = new if key in old else old
        if (old.get(key, new.get(key)) is None and any(name.startswith(key + ".") for name in other)
                and not resumable(key)):
            changed.append(key)
    if changed:
        details = "; ".join(f"{key}: {value(old, key)!r} in the checkpoint, {value(new, key)!r} now"
                            for key in sorted(changed))
        raise CheckpointError(
            f"cannot resume with a different {', '.join(sorted(changed))} ({details}): these fields decide what "
            "is trained; drop the override, or start a new run"
        )
