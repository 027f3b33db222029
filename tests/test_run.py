"""A short end-to-end run through TrainingRun.run: the run directory a user gets."""

import json

import pytest
import torch

from conftest import small_config
from grpo_dist.controller.run import TrainingRun


@pytest.mark.slow  # a whole run, tens of seconds
def test_a_short_run_writes_the_run_directory(ray_cluster, tmp_path):
    config = small_config(tmp_path, "trainer.steps=2", "trainer.eval_every=1")
    run_dir = tmp_path / "run"
    summary = TrainingRun(config, run_dir).run()
    assert summary["steps"] == 2 and 0.0 <= summary["eval_accuracy_after"] <= 1.0
    saved = json.loads((run_dir / "summary.json").read_text())
    for key in ("eval_accuracy_before", "eval_accuracy_after", "steps", "wall_seconds"):
        assert key in saved
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["eval", "train", "eval", "train", "eval"]
    assert (run_dir / "report.png").stat().st_size > 10_000
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert torch.isfinite(torch.tensor([r["loss/total"] for r in records if r["kind"] == "train"])).all()
