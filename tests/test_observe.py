"""What a short run shows: every sink gets the same metrics, samples carry the learner's
advantages, the report is drawn, and `python -m grpo_dist.eval` on the final checkpoint
reproduces the run's final held-out accuracy."""

import json
import subprocess
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import small_config
from grpo_dist import grpo
from grpo_dist.controller.loop import Trainer

STEPS = 3


@pytest.fixture(scope="module")
def run_dir(ray_cluster, tmp_path_factory):
    output = tmp_path_factory.mktemp("runs")
    config = small_config(output, "rollout.engine=transformers", f"trainer.steps={STEPS}", "trainer.eval_every=2",
                          "trainer.samples_every=2", "trainer.samples_per_log=3", "algo.advantage_scale=none",
                          "trainer.loggers=[jsonl, tensorboard, wandb]")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        Trainer(config, output / "run").run()
    return output / "run"


def records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_every_sink_gets_the_same_metrics(run_dir):
    train, evals = records(run_dir, "train"), records(run_dir, "eval")
    assert [r["step"] for r in train] == [1, 2, 3] and [r["step"] for r in evals] == [0, 2, 3]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for record in train + evals:
        for name, value in record.items():
            if name in ("kind", "step", "wall_s"):
                continue
            logged = {e.step: e.value for e in events.Scalars(name)}
            assert logged[record["step"]] == pytest.approx(value, rel=1e-6), name
    assert "samples/text_summary" in events.Tags()["tensors"]
    wandb_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1 and list(wandb_runs[0].glob("run-*.wandb"))


def test_system_metrics_are_logged_each_step(run_dir):
    for record in records(run_dir, "train"):
        assert record["system/engine_peak_memory_mb"] > 100  # a Python process with torch and a model
        assert record["system/generate_tokens_per_s"] > 0
        # step_s is the wall time between two steps' ends; the stages may overlap (async mode)
        assert record["time/step_s"] > record["time/learn_s"] > 0
        assert 0 <= record["time/rollout_idle_fraction"] < 1 and 0 <= record["time/learner_idle_fraction"] < 1


def test_samples_carry_completions_rewards_and_the_learners_advantages(run_dir):
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 2, 2]
    for sample in samples:
        assert sample["policy_version"] == 1  # step 2 samples with the weights of step 1
        assert sample["prompt"] == sample["row"]["prompt"] and sample["prompt_index"] >= 0
        rewards = torch.tensor([c["reward"] for c in sample["completions"]])
        expected = grpo.group_advantages(rewards, len(rewards), scale="none")  # the run's algo.advantage_scale
        assert [c["advantage"] for c in sample["completions"]] == pytest.approx(expected.tolist())
        assert all(c["text"] and c["tokens"] > 0 for c in sample["completions"])


def test_the_run_draws_its_report(run_dir):
    assert (run_dir / "report.png").stat().st_size > 50_000


@pytest.mark.slow  # a subprocess that starts its own Ray: about 40 s on 2 busy cores
def test_evaluating_the_final_checkpoint_reproduces_the_runs_accuracy(run_dir, tmp_path):
    summary = json.loads((run_dir / "summary.json").read_text())
    result = subprocess.run(
        [sys.executable, "-m", "grpo_dist.eval", "--checkpoint", str(run_dir), "--k", "1,2",
         "--output", str(tmp_path / "eval.json"), "cluster.address=local", "cluster.num_cpus=2"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    assert metrics["eval/accuracy"] == summary["eval_accuracy_after"]
    assert metrics["eval/rows"] == summary["eval_rows"] == 32
    assert metrics["eval/mean_reward"] == metrics["eval/accuracy"]  # the only reward is exact_answer
    assert 0 <= metrics["eval/pass@1"] <= metrics["eval/pass@2"] <= 1
