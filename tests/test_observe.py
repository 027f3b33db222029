"""What a short run shows: every sink gets the same metrics (TensorBoard's and wandb's read back
from their files), samples carry the advantages of their rewards, the report is drawn, and
`python -m grpo_dist.eval` on the final checkpoint reproduces the run's final held-out accuracy."""

import json
import math
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from conftest import small_config
from grpo_dist.controller.run import TrainingRun

# A whole short run (3 steps, every sink, evaluations, the report): the slow tier.
pytestmark = pytest.mark.slow

STEPS = 3


@pytest.fixture(scope="module")
def run_dir(ray_cluster, tmp_path_factory):
    output = tmp_path_factory.mktemp("runs")
    config = small_config(output, "rollout.engine=transformers", f"trainer.steps={STEPS}", "trainer.eval_every=2",
                          "trainer.samples_every=2", "trainer.samples_per_log=3",
                          "trainer.loggers=[jsonl, tensorboard, wandb]")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        TrainingRun(config, output / "run").run()
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
    [wandb_file] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(wandb_file)
    assert sorted(history) == [0, 1, 2, 3]  # a step's train and eval metrics share one row
    for step, row in history.items():
        logged = [r for r in train + evals if r["step"] == step]
        expected = {name: value for r in logged for name, value in r.items() if name not in ("kind", "step", "wall_s")}
        assert {name: value for name, value in row.items() if not name.startswith(("_", "samples/"))} == expected
    assert history[2]["samples/_type"] == "table-file"  # the samples, as a table


def wandb_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of an offline run's .wandb file: a ":W&B" header, then LevelDB's log format
    (blocks of 32 KiB; each piece has a 7-byte header, crc32, length, and type: full, first,
    middle or last), each record a protobuf `Record`."""
    data, block = path.read_bytes(), 32768
    assert struct.unpack_from("<4sHB", data) == (b":W&B", 0xBEE1, 0)
    position, pending = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack_from("<IHB", data, position)
        if kind == 0:  # zeros: the writer's preallocated end
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path: Path) -> dict[int, dict]:
    """The history rows of an offline wandb run, by step: {step: {name: value}}."""
    rows: dict[int, dict] = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            row = rows.setdefault(record.history.step.num, {})
            row.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item})
    return rows


def test_system_metrics_are_logged_each_step(run_dir):
    evaluated = {record["step"] for record in records(run_dir, "eval")}
    for record in records(run_dir, "train"):
        assert record["system/engine_peak_memory_mb"] > 100  # a Python process with torch and a model
        assert record["system/generate_tokens_per_s"] > 0
        assert record["time/step_s"] > 0 and record["time/learn_s"] > 0
        # step_s is the wall time from the previous step's end (or the evaluation after it) to this
        # one's. The run overlaps learning with rollout (learner.threads=1): while step 2's
        # evaluation runs, step 3's chunks are generated and learned, so only a step that follows
        # no evaluation holds all of its learning.
        if record["step"] - 1 not in evaluated:
            assert record["time/step_s"] > record["time/learn_s"]
        assert 0 <= record["time/rollout_idle_fraction"] < 1 and 0 <= record["time/learner_idle_fraction"] < 1


def advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """algo.advantage_scale=std (the run's): (r - mean) / (std + eps), the std with Bessel's
    correction; a group whose rewards are all equal has none."""
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def test_samples_carry_completions_rewards_and_the_advantages_of_their_rewards(run_dir):
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 2, 2]
    for sample in samples:
        assert sample["policy_version"] == 1  # step 2 samples with the weights of step 1
        assert sample["prompt"] == sample["row"]["prompt"] and sample["prompt_index"] >= 0
        rewards = [c["reward"] for c in sample["completions"]]
        assert rewards == [c["reward_parts"]["exact_answer"] for c in sample["completions"]]  # the only function
        expected = advantages(rewards)
        assert [c["advantage"] for c in sample["completions"]] == pytest.approx(expected, rel=1e-5, abs=1e-6)
        assert all(c["text"] and c["tokens"] > 0 for c in sample["completions"])
    assert any(len({c["reward"] for c in s["completions"]}) > 1 for s in samples)  # not only zeros to compare


def test_the_run_draws_its_report(run_dir):
    assert (run_dir / "report.png").stat().st_size > 50_000


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
