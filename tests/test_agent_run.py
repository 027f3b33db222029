"""Agent episodes trained end to end: `python -m grpo_dist.launch` with an `agent:` section (the
built-in chat agent over the default task, a tiny chat model), two GRPO steps."""

import json

import pytest

from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from runs import SMALL, finish, start


@pytest.mark.timeout(400)
@pytest.mark.slow  # a whole run
def test_two_steps_of_agent_episodes_through_the_launcher(tmp_path):
    save_tiny_model(tmp_path / "model", "llama", chat=True, max_positions=512,
                    generation_config={"eos_token_id": [IM_END]})
    run = start(*SMALL, f"model.path={tmp_path / 'model'}", f"trainer.output_dir={tmp_path}", "trainer.run_name=run",
                "trainer.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=2",
                "agent.name=grpo_dist.agent.examples:chat", "agent.max_episode_tokens=200", "agent.timeout_s=60",
                "reward.functions=[{name: env_reward}]", "reward.accuracy_from=env_reward")
    code, output = finish(run, timeout=360)
    assert code == 0, output[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2
    for record in train:
        assert record["env/failed"] == 0 and record["env/stop_reasons/done"] == 8  # 4 prompts x 2 episodes
        assert record["env/turns_mean"] == 1 and record["reward/env_reward/failures"] == 0
