"""The run report: a PNG from metrics.jsonl, with or without every metric it can show."""

import json
import math

import pytest

from grpo_dist.observe.plots import PANELS, panel_notes, plot_panel, plot_stages, read_records, write_report
from grpo_dist.report import main

STAGES = ("time/generate_s", "time/reward_s", "time/learn_s", "time/sync_s", "time/step_s")


def write_metrics(run_dir, steps, names):
    """A metrics.jsonl like a run's: an evaluation every 5 steps, the training metrics `names`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(steps + 1):
        if step % 5 == 0:
            accuracy = 0.3 + 0.6 * step / steps
            lines.append({"kind": "eval", "step": step, "eval/accuracy": accuracy, "eval/rows": 200,
                          "eval/accuracy_stderr": math.sqrt(accuracy * (1 - accuracy) / 200)})
        if step:
            values = {"reward/mean": 0.4 + 0.5 * step / steps, "reward/accuracy": 0.35 + 0.5 * step / steps,
                      "loss/kl": 0.002 * step, "policy/clip_fraction": 0.05 / step, "policy/entropy": 1.2 - 0.03 * step,
                      "rollout/completion_length": 6 - 0.1 * step, "time/generate_s": 0.4, "time/reward_s": 0.05,
                      "time/learn_s": 0.6, "time/sync_s": 0.03, "time/step_s": 0.7}
            lines.append({"kind": "train", "step": step, "wall_s": 2.0 * step,
                          **{name: values[name] for name in names}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_report_draws_every_panel(tmp_path):
    names = ("reward/mean", "reward/accuracy", "loss/kl", "policy/clip_fraction", "policy/entropy",
             "rollout/completion_length", *STAGES)
    write_metrics(tmp_path / "run", 20, names)
    path = write_report(tmp_path / "run")
    assert path == tmp_path / "run" / "report.png" and path.stat().st_size > 50_000


def test_missing_metrics_leave_a_noted_empty_panel(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_metrics(tmp_path / "run", 3, ("reward/mean", "time/generate_s"))  # no KL, clip, entropy, length
    assert main([str(tmp_path / "run"), "--output", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").stat().st_size > 20_000 and capsys.readouterr().out.strip() == str(tmp_path / "r.png")
    train, _ = read_records(tmp_path / "run")
    fig, (drawn, empty) = plt.subplots(1, 2)
    plot_panel(drawn, PANELS[0], [{**r, "loss/kl": 0.1} for r in train], notes={})
    plot_panel(empty, PANELS[0], train, notes={"loss/kl": "flat by construction"})
    assert not drawn.texts and len(drawn.lines) == 1
    assert not empty.lines and [t.get_text() for t in empty.texts] == ["not logged by this run:\nloss/kl"]
    plt.close(fig)


def test_a_folder_without_metrics_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


@pytest.mark.parametrize("mode,note", [("sync", "sync: stages in turn"),
                                       ("async", "async, max_staleness 2: stages overlap")])
def test_the_time_panel_draws_each_stage_and_the_wall_time_as_lines(tmp_path, mode, note):
    """Not a stack: in async mode the stages overlap and do not add up to the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_metrics(tmp_path / "run", 4, STAGES)
    train, _ = read_records(tmp_path / "run")
    fig, ax = plt.subplots()
    plot_stages(ax, train, mode, 2)
    assert [line.get_label() for line in ax.get_lines()] == ["generate", "reward", "learn", "weight sync",
                                                             "step (wall time)"]
    assert not ax.collections, "no stacked areas"
    assert ax.get_legend().get_title().get_text() == note and ax.get_ylabel() == "seconds"
    plt.close(fig)


@pytest.mark.parametrize("algo,expected", [
    ({"beta": 0.0, "mu": 1, "minibatch_size": None}, {"loss/kl", "policy/clip_fraction"}),
    ({"beta": 0.04, "mu": 2, "minibatch_size": None}, set()),
    ({"beta": 0.04, "mu": 1, "minibatch_size": 8}, set()),
])
def test_panels_flat_by_construction_say_why(tmp_path, algo, expected):
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"algo": algo}))
    assert set(panel_notes(tmp_path)) == expected
