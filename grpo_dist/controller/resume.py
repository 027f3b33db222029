"""The checkpoint a resume continues from: found, read back whole, its config checked, its state restored.

`--resume RUN_DIR` continues from the run's newest checkpoint (`resume_checkpoint`), `--resume
auto` from the newest that loads of any run (`find_checkpoint`); either must be complete and
its files as saved (manifest.py), and the new config may differ from the checkpoint's only in
the RESUMABLE fields (`check_resume_config`). A resume (run.py) puts the run's logs back as they
were at the checkpoint (`restore_metrics`), restores the cursor and the batches to draw first
(`restore_data`) and the learner's share (Learner.load_state). Sampling needs no saved state:
every completion's random stream derives from (seed, step, position, sample) (seeding.py).
The files and how they are written are checkpoints.py's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from grpo_dist.common.atomic import copy_atomic
from grpo_dist.config.schema import Config
from grpo_dist.controller.checkpoints import (CHECKPOINTS, CONFIG, METRICS, TRAINER_STATE, TrainerState, checkpoints,
                                              step_of)
from grpo_dist.controller.manifest import MANIFEST, CheckpointError, check_complete, is_complete
from grpo_dist.tasks.data import PromptCursor
from grpo_dist.common.types import Prompt

SAMPLES = "samples.jsonl"

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


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest step folder of a run, complete or not (see `check_complete`)."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


def resume_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint `--resume RUN_DIR` continues from: the run's newest, which must be complete."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise CheckpointError(f"--resume {run_dir}: no checkpoint in {run_dir / CHECKPOINTS}")
    return Checkpoint.load(latest)


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


def resume_hint(run_dir: Path) -> str:
    """Where a run that stopped can continue from, and the exact command, in words."""
    found = [path for path in checkpoints(run_dir) if is_complete(path, contents=False)]  # sizes: a quick look
    if not found:
        return "no checkpoint was saved yet: start the run again"
    step = step_of(found[-1])
    return f"the last checkpoint is {found[-1]} (step {step}); resume with: python -m grpo_dist.launch --resume {run_dir}"


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
