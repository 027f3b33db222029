"""Every supported architecture through both engines and the weight sync: a few GRPO steps each.

Llama (untied, GQA), Qwen2 (q/k/v biases; tied and untied embeddings) and Qwen3 (q/k
RMSNorm), built from configs (tasks/tiny.py), train for two steps on a real local Ray
cluster with weight verification on: after every sync each rollout worker's served weights
must hash to the learner's (the run raises otherwise), and the sampler's logprobs must
equal the learner's, which they only do when the engine computes with exactly those
weights, biases and norms included.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import ENGINES, small_config
from grpo_dist.tasks.tiny import save_tiny_model
from grpo_dist.controller.run import TrainingRun

ARCHITECTURES = {
    "llama-untied": ("llama", False),
    "qwen2-tied": ("qwen2", True),
    "qwen2-untied": ("qwen2", False),
    "qwen3-tied": ("qwen3", True),
}
# random tiny models write random characters: whether one holds a digit varies within a group
HAS_DIGIT = "reward.functions=[{name: answer_format, kwargs: {pattern: '.*[0-9].*'}}]"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folders = {}
    for name, (family, tied) in ARCHITECTURES.items():
        folders[name] = tmp_path_factory.mktemp(name)
        save_tiny_model(folders[name], family, tied=tied, num_heads=4, num_kv_heads=2, max_positions=128)
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_grpo_steps_keep_every_engine_on_the_learners_weights(ray_cluster, tmp_path, checkpoints, architecture,
                                                              engine):
    folder = checkpoints[architecture]
    config = small_config(
        tmp_path, f"model.path={folder}", f"rollout.engine={engine}", HAS_DIGIT, "reward.accuracy_from=answer_format",
        "rollout.temperature=0.7", "trainer.steps=2", "trainer.eval_every=0", "data.eval=null",
        "trainer.verify_weight_sync=true", "rollout.num_workers=1", "rollout.prompts_per_step=4",
    )
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["steps"] == 2 and summary["rollout_engine"] == engine
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        assert record["policy/grad_norm"] > 0
        assert record["rollout/logprob_diff_abs_max"] < 1e-3
    before, after = load_file(folder / "model.safetensors"), load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[name], after[name]) for name in before)
