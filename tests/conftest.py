"""Shared fixtures: a real local Ray cluster per test module, shut down afterwards."""

import os
from pathlib import Path

import pytest
import ray

from grpo_dist.config import Config, load_config, vllm_installed

TESTS = Path(__file__).resolve().parent

# Rollout engines to test: vLLM only where it is installed (scripts/setup_env.sh installs it).
ENGINES = [
    "transformers",
    pytest.param("vllm", marks=pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")),
]


@pytest.fixture(scope="module")
def ray_cluster():
    # The actors import the tests' helper modules as the driver does (rewards named "reward_helpers:...").
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_tests")
    yield
    ray.shutdown()


def small_config(output_dir, *extra: str) -> Config:
    """The default task, scaled down to fit 2 CPUs with two rollout workers."""
    return load_config(None, [
        "rollout.num_workers=2", "rollout.num_cpus=0.5", "rollout.threads=1",
        "rollout.group_size=4", "rollout.prompts_per_step=8",
        "learner.num_cpus=0.5", "learner.threads=1", "reward.num_cpus=0.25",
        "rollout.vllm.cpu_kv_cache_gb=0.25",
        "algo.lr=1e-3",  # large enough that two steps surely move the weights
        f"trainer.output_dir={output_dir}", "trainer.run_name=run", "trainer.progress=false",
        "data.eval_rows=32", *extra,
    ])
