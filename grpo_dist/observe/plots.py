"""A run's report: one PNG of what training did, read back from RUN_DIR/metrics.jsonl.

Drawn by TrainingRun.run at the end of a run, and by `python -m grpo_dist.report RUN_DIR` (report.py).

Six panels over the training steps: reward and held-out accuracy, KL to the reference,
clip fraction, entropy, completion length, and the seconds of each stage beside the step's
wall time. A metric the run did not log leaves its panel empty, with a note saying which one.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

STAGES = (("time/generate_s", "generate"), ("time/reward_s", "reward"), ("time/learn_s", "learn"),
          ("time/sync_s", "weight sync"))
STEP_TIME = ("time/step_s", "step (wall time)")


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]  # (metric name, legend label)


PANELS = (
    Panel("KL to the reference policy", "KL (k3), nats per token", (("loss/kl", "KL(π ‖ π_ref)"),)),
    Panel("Clip fraction", "fraction of completion tokens", (("policy/clip_fraction", "ratio clipped"),)),
    Panel("Policy entropy", "nats per token", (("policy/entropy", "entropy"),)),
    Panel("Completion length", "tokens per completion", (("rollout/completion_length", "mean length"),)),
)


def read_records(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and the evaluation records of RUN_DIR/metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "train"], [r for r in records if r.get("kind") == "eval"]


def curve(records: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    """Steps and values of the records that hold `name`."""
    points = [(r["step"], r[name]) for r in records if r.get(name) is not None]
    return [s for s, _ in points], [v for _, v in points]


def note_missing(ax: Any, names: list[str]) -> None:
    ax.text(0.5, 0.5, "not logged by this run:\n" + "\n".join(names), transform=ax.transAxes,
            ha="center", va="center", color="0.45", fontsize=9)


def plot_reward(ax: Any, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    """Training reward and sampled accuracy per step; held-out greedy accuracy with its standard error."""
    drawn = False
    for name, label, style in (("reward/mean", "train reward (mean)", "-"),
                               ("reward/accuracy", "train accuracy (sampled)", "--")):
        steps, values = curve(train, name)
        if steps:
            ax.plot(steps, values, style, label=label, alpha=0.85)
            drawn = True
    steps, values = curve(evals, "eval/accuracy")
    if steps:
        errors = [r.get("eval/accuracy_stderr", 0.0) for r in evals if r.get("eval/accuracy") is not None]
        ax.errorbar(steps, values, yerr=errors, fmt="o-", color="black", capsize=3, label="held-out accuracy (greedy)")
        drawn = True
    if drawn:
        ax.legend(loc="best", fontsize=8)
    else:
        note_missing(ax, ["reward/mean", "eval/accuracy"])
    ax.set_title("Reward and held-out accuracy")
    ax.set_ylabel("reward / accuracy (share correct)")


def plot_panel(ax: Any, panel: Panel, train: list[dict[str, Any]], notes: dict[str, str]) -> None:
    """The panel's series over the steps; `notes[name]` is written above a drawn series (why it is flat)."""
    missing = []
    for name, label in panel.series:
        steps, values = curve(train, name)
        if steps:
            ax.plot(steps, values, label=label)
        else:
            missing.append(name)
    if missing:
        note_missing(ax, missing)
    name = panel.series[0][0]
    if name in notes and not missing:
        ax.text(0.5, 0.9, notes[name], transform=ax.transAxes, ha="center", color="0.45", fontsize=8)
    ax.set_ylim(bottom=0)  # these are all >= 0; from 0, small changes do not look large
    ax.set_title(panel.title)
    ax.set_ylabel(panel.ylabel)


def plot_stages(ax: Any, train: list[dict[str, Any]], mode: str | None, max_staleness: int | None) -> None:
    """Each stage's seconds per step as a line, and the step's wall time (time/step_s) above them.

    Lines, not a stack: in async mode the stages overlap (the engines generate the next
    batches while the learner trains), so they do not add up to the step; the stage whose line
    runs along the wall time is the one the step waits for. In sync mode they add up to about
    the step, the rest being the controller's own time.
    """
    drawn = []
    for name, label in (*STAGES, STEP_TIME):
        steps, values = curve(train, name)
        if not steps:
            continue
        wall = name == STEP_TIME[0]
        ax.plot(steps, values, marker=".", label=label, color="black" if wall else None,
                linewidth=2.2 if wall else 1.4, zorder=3 if wall else 2)
        drawn.extend(values)
    if drawn:
        overlap = f"async, max_staleness {max_staleness}: stages overlap" if mode == "async" else "sync: stages in turn"
        ax.legend(loc="upper center", ncol=3, fontsize=8, title=overlap, title_fontsize=8)
        ax.set_ylim(0, 1.45 * max(drawn))  # room for the legend above the lines
    else:
        note_missing(ax, [name for name, _ in (*STAGES, STEP_TIME)])
        ax.set_ylim(bottom=0)
    ax.set_title("Seconds per step: each stage and the step")
    ax.set_ylabel("seconds")


def config_value(run_dir: Path, section: str, field: str) -> Any:
    """A field of RUN_DIR/config.yaml, or None where there is none."""
    path = run_dir / "config.yaml"
    tree = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return (tree or {}).get(section, {}).get(field)


def panel_notes(run_dir: Path) -> dict[str, str]:
    """Why a panel of this run is flat by construction, by its metric's name."""
    notes = {}
    if config_value(run_dir, "algo", "beta") == 0:
        notes["loss/kl"] = "algo.beta = 0: no reference model, KL not computed"
    if config_value(run_dir, "algo", "mu") == 1 and config_value(run_dir, "algo", "minibatch_size") is None:
        notes["policy/clip_fraction"] = ("one optimizer step per batch (algo.mu 1, no minibatches):\n"
                                         "the ratio is 1, nothing is clipped")
    return notes


def headline(run_dir: Path, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> str:
    """The figure's title: the run, its steps, and the held-out accuracy first to last."""
    text = f"{run_dir.name}: {len(train)} steps"
    if evals:
        first, last = evals[0], evals[-1]
        text += (f", held-out accuracy {first['eval/accuracy']:.3f} (step {first['step']}) → "
                 f"{last['eval/accuracy']:.3f} (step {last['step']}), {last.get('eval/rows', '?')} rows")
    if train and "wall_s" in train[-1]:
        text += f", {train[-1]['wall_s']:.0f} s"
    return text


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    """Draw the report of `run_dir` into `output` (default RUN_DIR/report.png); returns the path."""
    from matplotlib.figure import Figure  # no pyplot: no global state, so any thread may draw
    from matplotlib.ticker import MaxNLocator

    train, evals = read_records(run_dir)
    output = output or run_dir / "report.png"
    fig = Figure(figsize=(15, 8))
    axes = fig.subplots(2, 3, sharex=True)
    plot_reward(axes[0, 0], train, evals)
    notes = panel_notes(run_dir)
    for ax, panel in zip((axes[0, 1], axes[0, 2], axes[1, 0], axes[1, 1]), PANELS):
        plot_panel(ax, panel, train, notes)
    plot_stages(axes[1, 2], train, config_value(run_dir, "trainer", "mode"),
                config_value(run_dir, "trainer", "max_staleness"))
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[1]:
        ax.set_xlabel("GRPO step")
    fig.suptitle(headline(run_dir, train, evals))
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    return output


def import_drawing() -> None:
    """What write_report imports: matplotlib's figure, ticks and the PNG backend (0.8 s on 2 cores)."""
    import matplotlib.backends.backend_agg  # noqa: F401  (savefig's PNG canvas)
    import matplotlib.figure  # noqa: F401
    import matplotlib.ticker  # noqa: F401


def report_thread() -> ThreadPoolExecutor:
    """The thread that will draw report.png, importing matplotlib from now on: TrainingRun.run makes
    it before the final evaluation, while the driver only waits for the rollout workers."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="report")
    pool.submit(import_drawing)
    return pool


def write_report_beside(run_dir: Path, pool: ThreadPoolExecutor) -> Future:
    """`write_report(run_dir)` in `pool`'s thread (report_thread's): seconds of drawing, off the
    run's path (TrainingRun.run starts it once the metrics are complete; `result()` waits and
    re-raises)."""
    try:
        return pool.submit(write_report, run_dir)
    finally:
        pool.shutdown(wait=False)
