"""configs/code_unittest.yaml: its data, its validation, and two GRPO steps on a local Ray cluster."""

import json
from pathlib import Path

import pytest
import ray

from grpo_dist.config.schema import load_config, resolve_path
from grpo_dist.tasks.data import read_jsonl
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.tasks.code import load_problems, make_splits
from grpo_dist.tasks.tiny import save_tiny_model
from grpo_dist.controller.run import TrainingRun
from test_reward_worker import ADD, ADD_TESTS, ADVERSARIAL, group

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "code_unittest.yaml"
ON_TWO_CPUS = [
    "model.dtype=float32", "rollout.engine=transformers",
    "rollout.num_gpus=0", "rollout.num_cpus=0.5", "rollout.threads=1", "rollout.group_size=2",
    "rollout.prompts_per_step=2", "rollout.max_new_tokens=8", "learner.num_gpus=0", "learner.num_cpus=0.5",
    "learner.threads=1", "reward.num_cpus=0.5", "reward.processes=2", "data.eval_rows=2",
    "trainer.steps=2", "trainer.eval_every=0", "trainer.progress=false", "trainer.save_final=false",
]


def test_the_data_files_are_the_bundled_problems():
    config = load_config(RECIPE)
    train, eval_rows = make_splits(load_problems())
    assert read_jsonl(config.data.train) == train and read_jsonl(config.data.eval) == eval_rows
    assert len(train) + len(eval_rows) == len(load_problems()) and not {r["id"] for r in train} & {
        r["id"] for r in eval_rows
    }


def test_the_recipe_validates_with_a_hub_model_and_the_unit_test_reward():
    config = load_config(RECIPE)
    assert config.model.path == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert [f.name for f in config.reward.functions] == ["unit_tests"] and config.reward.accuracy_from == "unit_tests"
    row = json.loads(Path(resolve_path(config.data.train)).read_text().splitlines()[0])
    assert isinstance(row["tests"], list) and "```python" in config.data.prompt_template.format(**row)


@pytest.mark.timeout(120)
def test_a_reward_actor_keeps_serving_after_adversarial_programs(ray_cluster):
    config = load_config(None, [
        "reward.functions=[{name: unit_tests, kwargs: {timeout_s: 1.0}}]", "reward.accuracy_from=unit_tests",
        "reward.processes=2", "reward.timeout_s=5",
    ])
    actor = ray.remote(RewardWorker).options(num_cpus=0.5).remote(config.reward)
    try:
        [bad], failures = ray.get(actor.score.remote([group(ADVERSARIAL, tests=ADD_TESTS)]))
        assert bad.rewards == [0.0] * len(ADVERSARIAL) and failures == {"reward/unit_tests/failures": 0.0}
        [good], _ = ray.get(actor.score.remote([group([ADD], tests=ADD_TESTS)]))
        assert good.rewards == [1.0]
    finally:
        ray.get(actor.close.remote())
        ray.kill(actor)


@pytest.mark.timeout(300)
@pytest.mark.slow  # a whole run, tens of seconds
def test_two_grpo_steps_of_the_recipe_with_the_tiny_local_model(ray_cluster, tmp_path):
    # a tiny model with the context the code prompts need (the arithmetic model's is 64 positions)
    save_tiny_model(tmp_path / "model", "qwen2", max_positions=1024)
    config = load_config(RECIPE, [*ON_TWO_CPUS, f"model.path={tmp_path / 'model'}", f"trainer.output_dir={tmp_path}",
                                  "trainer.run_name=run"])
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2
    for record in train:
        assert record["reward/unit_tests/failures"] == 0  # garbage programs are scored, not failures
        assert 0.0 <= record["reward/unit_tests/mean"] <= 1.0
