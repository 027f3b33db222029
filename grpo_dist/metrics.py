"""Run outputs: metrics.jsonl, a console line per step, the reward/accuracy plot, summary.json."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

CONSOLE_KEYS = (
    ("reward/mean", "reward"),
    ("reward/accuracy", "acc"),
    ("loss/kl", "kl"),
    ("rollout/completion_length", "len"),
    ("time/step_s", "s/step"),
)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(staging, path)


def standard_error(accuracy: float, n: int) -> float:
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / max(n, 1))


def console_line(metrics: dict[str, float]) -> str:
    return " ".join(f"{label}={metrics[key]:.3g}" for key, label in CONSOLE_KEYS if key in metrics)


class MetricsLog:
    """Appends one JSON object per step (and per evaluation) to run_dir/metrics.jsonl."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


def plot_run(records: list[dict[str, Any]], path: Path) -> None:
    """Training reward and accuracy per step, with the held-out evaluations as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = [r["step"] for r in train]
    ax.plot(steps, [r["reward/mean"] for r in train], label="train reward (mean)", alpha=0.8)
    ax.plot(steps, [r["reward/accuracy"] for r in train], "--", label="train accuracy (sampled)", alpha=0.8)
    if evals:
        ax.errorbar(
            [r["step"] for r in evals],
            [r["eval/accuracy"] for r in evals],
            yerr=[r["eval/accuracy_stderr"] for r in evals],
            fmt="o-",
            color="black",
            capsize=3,
            label="held-out accuracy (greedy)",
        )
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("grpo_dist: reward and accuracy per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
