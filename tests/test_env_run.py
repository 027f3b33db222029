"""Multi-turn training end to end: configs/code_feedback.yaml over the code recipe, two GRPO
steps on a local Ray cluster with a tiny chat model; episodes reach the metrics and samples.jsonl."""

import json
from pathlib import Path

import pytest

from grpo_dist.config import load_config
from grpo_dist.controller.loop import Trainer
from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from test_code_recipe import ON_TWO_CPUS, RECIPE

FEEDBACK = Path(__file__).resolve().parent.parent / "configs" / "code_feedback.yaml"


def test_the_recipe_validates():
    config = load_config([RECIPE, FEEDBACK])
    assert config.env.name == "code_feedback" and config.reward.accuracy_from == "env_reward"


@pytest.mark.timeout(400)
@pytest.mark.slow  # a whole run
@pytest.mark.parametrize("history", ["append", "per_turn"])
def test_two_steps_of_code_feedback_episodes(ray_cluster, tmp_path, history):
    # llama: a saved qwen2 checkpoint reloads its tokenizer as one that drops whitespace
    save_tiny_model(tmp_path / "model", "llama", chat=True, max_positions=1024,
                    generation_config={"eos_token_id": [IM_END]})
    config = load_config([RECIPE, FEEDBACK], [
        *ON_TWO_CPUS, f"model.path={tmp_path / 'model'}", f"trainer.output_dir={tmp_path}", "trainer.run_name=run",
        "env.max_turns=2", "env.max_episode_tokens=900", "env.max_observation_tokens=48", "env.concurrency=4",
        "trainer.samples_every=1", f"env.history={history}"])
    summary = Trainer(config, tmp_path / "run").run()
    assert summary["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2
    for record in train:
        assert record["reward/env_reward/failures"] == 0 and record["env/failed"] == 0
        assert 1 <= record["env/turns_mean"] <= record["env/turns_max"] <= 2
        stops = {k: v for k, v in record.items() if k.startswith("env/stop_reasons/")}
        assert sum(stops.values()) == 4  # prompts_per_step 2 x group_size 2 episodes
        assert record["env/step_s"] > 0
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    episode = samples[0]["completions"][0]["episode"]
    assert episode["transcript"][0]["role"] == "user" and "```python block" in episode["transcript"][0]["content"]
    assert [m["role"] for m in episode["transcript"][1:]][:1] == ["assistant"]
    assert len(episode["replies"]) == episode["turns"] == len(episode["step_rewards"])
