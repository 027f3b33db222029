"""Run outputs: the metric sinks, sample completions, summary.json.

Every metric reaches every configured sink under one name, grouped by what it measures
(reward/, loss/, policy/, rollout/, time/, system/, eval/; docs/observability.md):

    console        a progress bar with a few key numbers (or a line every 10 steps)
    jsonl          RUN_DIR/metrics.jsonl, one object per step and per evaluation; always on
    tensorboard    RUN_DIR/tensorboard/, scalars and the samples as text
    wandb          a wandb run in RUN_DIR/wandb/ (optional package; WANDB_MODE=offline works offline)

Samples (a few prompts with their completions, rewards and advantages) go to
RUN_DIR/samples.jsonl and to the TensorBoard and wandb sinks.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

import torch
from tqdm import tqdm

from grpo_dist import grpo
from grpo_dist.config.schema import Config
from grpo_dist.controller.errors import OutputFailed, writing
from grpo_dist.common.types import Group

CONSOLE_KEYS = (
    ("reward/mean", "reward"),
    ("reward/accuracy", "acc"),
    ("loss/kl", "kl"),
    ("rollout/completion_length", "len"),
    ("time/step_s", "s/step"),
)


def console_line(metrics: dict[str, float]) -> str:
    return " ".join(f"{label}={metrics[key]:.3g}" for key, label in CONSOLE_KEYS if key in metrics)


def sample_records(groups: list[Group], step: int, scale: grpo.AdvantageScale) -> list[dict[str, Any]]:
    """One record per group: the prompt, its row, and every completion with its reward and
    advantage (grpo.group_advantages over the group's rewards, as the learner computes them)."""
    records = []
    for group in groups:
        advantages = grpo.group_advantages(torch.tensor(group.rewards), len(group.rewards), scale=scale)
        completions = [
            {
                "text": completion.text,
                "reward": group.rewards[i],
                "advantage": advantages[i].item(),
                "reward_parts": {name: values[i] for name, values in group.reward_parts.items()},
                "tokens": len(completion.token_ids),
                "finish_reason": completion.finish_reason,
                # a multi-turn episode, turn by turn: transcript, step rewards, infos, stop reason
                **({"episode": completion.episode} if completion.episode is not None else {}),
            }
            for i, completion in enumerate(group.completions)
        ]
        records.append({"step": step, "policy_version": group.policy_version, "prompt_index": group.prompt_index,
                        "prompt": group.prompt, "row": group.row, "completions": completions})
    return records


def samples_markdown(records: list[dict[str, Any]]) -> str:
    """The samples as markdown tables (TensorBoard's text panel renders them)."""

    def cell(text: str) -> str:
        return "`" + text.replace("`", "'").replace("|", "\\|").replace("\n", " ⏎ ") + "`"

    parts = []
    for record in records:
        parts.append(f"**prompt** {cell(record['prompt'])} (policy version {record['policy_version']})\n\n"
                     "| # | reward | advantage | completion |\n|---|---|---|---|")
        parts.extend(f"| {i} | {c['reward']:.3g} | {c['advantage']:+.3f} | {cell(c['text'])} |"
                     for i, c in enumerate(record["completions"]))
        parts.append("")
    return "\n".join(parts)


class Sink(Protocol):
    def scalars(self, kind: str, step: int, metrics: dict[str, float]) -> None: ...

    def samples(self, step: int, records: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """metrics.jsonl: {"kind": "train"|"eval", "step", "wall_s", **metrics} per line;
    samples.jsonl: one sample record (see `sample_records`) per line."""

    def __init__(self, run_dir: Path, started: float) -> None:
        self.metrics_path, self.samples_path = run_dir / "metrics.jsonl", run_dir / "samples.jsonl"
        self.started = started

    def scalars(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        record = {"kind": kind, "step": step, "wall_s": round(time.time() - self.started, 2), **metrics}
        with writing(self.metrics_path), self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        with writing(self.samples_path), self.samples_path.open("a") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)

    def close(self) -> None:
        pass


class ConsoleSink:
    """A tqdm bar over the training steps with the CONSOLE_KEYS, or (progress off) a line
    every 10 steps; a line per evaluation either way."""

    def __init__(self, steps: int, progress: bool) -> None:
        self.steps, self.progress = steps, progress
        self.bar: tqdm | None = None

    def scalars(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        if kind == "eval":
            self.note(f"step {step:4d}  held-out accuracy {metrics['eval/accuracy']:.3f}"
                      f" ± {metrics['eval/accuracy_stderr']:.3f} ({metrics['eval/rows']} rows)")
        elif self.progress:
            if self.bar is None:
                self.bar = tqdm(total=self.steps, desc="GRPO", dynamic_ncols=True, mininterval=1.0)
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(console_line(metrics), refresh=False)
        elif step % 10 == 0:
            print(f"step {step:4d}  {console_line(metrics)}", flush=True)

    def note(self, message: str) -> None:
        if self.bar is not None:
            tqdm.write(message)
        else:
            print(message, flush=True)

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class TensorBoardSink:
    """Scalars under the metric names, samples as a markdown text summary named "samples".

    A resumed run passes `purge_step`, its first step: TensorBoard hides what the run had
    written for that step and later ones before it stopped (they are redone)."""

    def __init__(self, run_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = run_dir / "tensorboard"
        with writing(self.folder):
            self.writer = SummaryWriter(log_dir=str(self.folder), purge_step=purge_step)

    def scalars(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        with writing(self.folder):
            for name, value in metrics.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        with writing(self.folder):
            self.writer.add_text("samples", samples_markdown(records), step)

    def close(self) -> None:
        with writing(self.folder):
            self.writer.close()


class WandbSink:
    """A wandb run named after the run directory, its files in RUN_DIR/wandb; the mode
    (online, offline) is wandb's own setting (WANDB_MODE). Its id derives from the run
    directory's path, so a resumed run continues the same wandb run (wandb keeps the values
    it already had for the steps that are redone)."""

    def __init__(self, run_dir: Path, config: Config) -> None:
        import wandb

        self.wandb = wandb
        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(project=config.trainer.wandb_project, name=run_dir.name, dir=str(run_dir),
                              config=config.model_dump(mode="json"), id=run_id, resume="allow")

    def scalars(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        columns = ["policy_version", "prompt", "completion", "reward", "advantage"]
        rows = [[r["policy_version"], r["prompt"], c["text"], c["reward"], c["advantage"]]
                for r in records for c in r["completions"]]
        self.run.log({"samples": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """The one object the trainer logs through: it fans every call out to the configured sinks.
    A file a sink cannot write (a full disk) raises OutputFailed, naming it: the run ends there."""

    def __init__(self, run_dir: Path, config: Config, started: float | None = None,
                 resumed_after: int | None = None) -> None:
        """`resumed_after`: the checkpoint's step when the run resumes (its logs go on from there)."""
        trainer = config.trainer
        self.config = config
        self.console = ConsoleSink(trainer.steps, trainer.progress)
        self.sinks: list[Sink] = [self.console, JsonlSink(run_dir, started or time.time())]
        if "tensorboard" in trainer.loggers:
            self.sinks.append(TensorBoardSink(run_dir, None if resumed_after is None else resumed_after + 1))
        if "wandb" in trainer.loggers:
            self.sinks.append(WandbSink(run_dir, config))
        self.failed = False  # a sink could not write: closing them may fail the same way

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """A training step's metrics."""
        self._each(lambda sink: sink.scalars("train", step, metrics))

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        """An evaluation's metrics (eval.evaluate), at the step whose weights were evaluated."""
        self._each(lambda sink: sink.scalars("eval", step, metrics))

    def wants_samples(self, step: int) -> bool:
        every = self.config.trainer.samples_every
        return every > 0 and step % every == 0

    def log_samples(self, step: int, groups: list[Group]) -> None:
        """The first `trainer.samples_per_log` of a step's scored groups."""
        records = sample_records(groups[: self.config.trainer.samples_per_log], step, self.config.algo.advantage_scale)
        self._each(lambda sink: sink.samples(step, records))

    def _each(self, call: Callable[[Sink], None]) -> None:
        try:
            for sink in self.sinks:
                call(sink)
        except OutputFailed:
            self.failed = True
            raise

    def note(self, message: str) -> None:
        """A line on the console that does not break the progress bar."""
        self.console.note(message)

    def close(self) -> None:
        """Close every sink; after a failed write, what closing one raises is dropped (the first
        failure is the one to tell)."""
        for sink in self.sinks:
            try:
                sink.close()
            except OutputFailed:
                if not self.failed:
                    raise
