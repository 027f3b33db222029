"""configs/gsm8k.yaml: it names the hub model and dataset, and it runs end to end on a tiny local
chat model and a tiny local copy of GSM8K's hub layout, through the same config and data path;
configs/math_tool.yaml over it (GSM8K with a Python interpreter as a tool) too."""

import json
from pathlib import Path

import pytest

from gsm8k_helpers import write_gsm8k
from grpo_dist.config.schema import load_config, vllm_installed
from grpo_dist.tasks.data import prepare_data
from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from grpo_dist.controller.run import TrainingRun

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "gsm8k.yaml"
TOOL = RECIPE.parent / "math_tool.yaml"
# the recipe's GPU resources and sizes, scaled to two shared CPU cores; nothing about the data
ON_TWO_CPUS = [
    "rollout.num_gpus=0", "rollout.num_cpus=0.5", "rollout.threads=1", "rollout.group_size=2",
    "rollout.prompts_per_step=2", "rollout.max_new_tokens=16", "rollout.vllm.cpu_kv_cache_gb=0.25",
    "learner.num_gpus=0", "learner.num_cpus=0.5", "learner.threads=1", "reward.num_cpus=0.5",
    "reward.processes=1", "trainer.steps=2", "trainer.eval_every=0", "trainer.progress=false",
]


@pytest.fixture(scope="module")
def local_copies(tmp_path_factory):
    """A tiny Qwen2 chat model whose generation config reads like Qwen2.5-Instruct's, and GSM8K's layout."""
    model = tmp_path_factory.mktemp("qwen_like")
    save_tiny_model(model, "qwen2", chat=True, max_positions=1024, generation_config={
        "eos_token_id": [IM_END, "<eos>"], "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8,
        "top_k": 20, "do_sample": True})
    data = write_gsm8k(tmp_path_factory.mktemp("gsm8k"), train=6, test=2)
    return [f"model.path={model}", f"data.train={data}", f"data.eval={data}"]


def test_the_recipe_names_the_hub_model_and_dataset():
    config = load_config(RECIPE)
    assert config.model.path == "Qwen/Qwen2.5-0.5B-Instruct" and config.model.dtype == "bfloat16"
    data = config.data
    assert (data.train, data.eval, data.subset, data.split, data.eval_split) == (
        "openai/gsm8k", "openai/gsm8k", "main", "train", "test")
    assert data.prompt_field == "question" and data.answer_field == "answer" and data.chat_template == "true"
    assert [f.name for f in config.reward.functions] == ["math_answer"] == [config.reward.accuracy_from]
    assert config.rollout.engine == "vllm" and config.rollout.vllm.max_model_len == 1024


def test_local_copies_load_through_the_recipes_data_path(local_copies):
    data = prepare_data(load_config(RECIPE, [*ON_TWO_CPUS, *local_copies]))
    assert len(data.train) == 6 and len(data.eval) == 2
    first = data.train[0]
    assert first.text.startswith("<|im_start|>system\nPlease reason step by step")
    assert first.text.endswith(f"{first.row['question']}<|im_end|>\n<|im_start|>assistant\n")
    assert first.row["answer"].endswith("#### 12")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not vllm_installed(), reason="the recipe runs vLLM")
def test_two_grpo_steps_of_the_recipe_on_local_copies(ray_cluster, tmp_path, local_copies):
    config = load_config(RECIPE, [*ON_TWO_CPUS, *local_copies, f"trainer.output_dir={tmp_path}",
                                  "trainer.run_name=run"])
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["steps"] == 2 and summary["rollout_engine"] == "vllm" and summary["eval_rows"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2
    for record in train:
        assert record["reward/math_answer/failures"] == 0  # every reference answer parsed
        assert record["rollout/logprob_diff_abs_max"] < 0.05  # bf16 sampler and learner


def test_the_tool_recipe_lays_the_interpreter_over_gsm8k():
    config = load_config([RECIPE, TOOL])
    assert config.env.name == "python_tool" and config.env.kwargs["prompt_field"] == config.data.prompt_field
    assert [f.name for f in config.reward.functions] == ["env_reward"] == [config.reward.accuracy_from]
    assert config.env.max_episode_tokens <= config.rollout.vllm.max_model_len


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_grpo_steps_of_the_tool_recipe_on_local_copies(ray_cluster, tmp_path, local_copies):
    """Episodes open with GSM8K's question, the sandbox answers the model's code, and every
    episode ends scored (a tiny random model rarely writes a block: its replies are answers)."""
    config = load_config([RECIPE, TOOL], [
        *ON_TWO_CPUS, *local_copies, "rollout.engine=transformers", f"trainer.output_dir={tmp_path}",
        "trainer.run_name=run", "env.max_episode_tokens=900", "env.max_observation_tokens=48",
        "env.concurrency=4", "trainer.samples_every=1"])
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for record in [r for r in records if r["kind"] == "train"]:
        assert record["env/failed"] == 0 and record["reward/env_reward/failures"] == 0
        assert 1 <= record["env/turns_mean"] <= record["env/turns_max"] <= 4
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    opening = samples[0]["completions"][0]["episode"]["transcript"][0]
    assert opening["role"] == "user" and "You may run Python" in opening["content"]
    assert opening["content"].split("\nYou may run Python")[0] in samples[0]["prompt"]  # the row's question
