"""Async mode end to end: max_staleness 0 is sync mode exactly; max_staleness 1 runs one version behind."""

import json

import pytest

from conftest import small_config
from grpo_dist.controller.loop import Trainer

# What depends on the clock, not on the computation.
TIMING = ("time/", "system/", "rollout/buffer_depth", "wall_s")


def run(tmp_path, name, *overrides):
    config = small_config(tmp_path, "rollout.engine=transformers", "trainer.steps=4", "trainer.eval_every=2",
                          "data.eval_rows=16", f"trainer.run_name={name}", *overrides)
    summary = Trainer(config, tmp_path / name).run()
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    computed = [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in records]
    return summary, computed, (tmp_path / name / "final" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_async_with_max_staleness_0_reproduces_sync_mode_and_1_runs_a_version_behind(ray_cluster, tmp_path):
    sync_summary, sync_records, sync_weights = run(tmp_path, "sync", "trainer.mode=sync")
    _, async0_records, async0_weights = run(tmp_path, "async0", "trainer.mode=async", "trainer.max_staleness=0")
    async1_summary, async1_records, async1_weights = run(tmp_path, "async1", "trainer.mode=async",
                                                         "trainer.max_staleness=1")
    assert async0_records == sync_records and async0_weights == sync_weights  # every metric, every bit

    sync_train = [r for r in sync_records if r["kind"] == "train"]
    async1_train = [r for r in async1_records if r["kind"] == "train"]
    assert [r["rollout/staleness_max"] for r in sync_train] == [0.0] * 4
    assert [r["rollout/staleness_max"] for r in async1_train] == [0.0, 1.0, 1.0, 1.0]
    assert async1_train[0] == sync_train[0], "batch 1 is sampled by version 0 in both modes"
    # from step 2 on the sampler is one version behind the learner: their logprobs differ
    assert all(r["rollout/logprob_diff_max"] > 1e-3 for r in async1_train[1:])
    assert all(r["rollout/logprob_diff_max"] < 1e-3 for r in sync_train)
    assert async1_weights != sync_weights
    assert (sync_summary["max_staleness"], async1_summary["max_staleness"]) == (0, 1)
