"""The default task learns with vLLM rollouts: a full short GRPO run (minutes)."""

import pytest

from grpo_dist.config.schema import load_config, vllm_installed
from grpo_dist.controller.run import TrainingRun


@pytest.mark.slow
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_default_task_learns_with_vllm_rollouts(ray_cluster, tmp_path):
    # measured: held-out greedy accuracy 0.323 -> 0.971 in 60 steps (124 s on 2 busy cores)
    config = load_config(None, ["rollout.engine=vllm", "rollout.vllm.cpu_kv_cache_gb=0.25", "trainer.steps=60",
                                "trainer.eval_every=0", "trainer.progress=false", "trainer.save_final=false",
                                f"trainer.output_dir={tmp_path}", "trainer.run_name=learn"])
    summary = TrainingRun(config, tmp_path / "learn").run()
    assert summary["rollout_engine"] == "vllm" and summary["steps"] == 60
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.3, summary
