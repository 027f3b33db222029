"""Configuration: recipes, overrides, and errors that name the field before anything starts."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_dist.config.schema import Config, ConfigError, dump_config, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_default_recipe_is_the_built_in_default():
    assert load_config(ROOT / "configs" / "default.yaml") == load_config(None) == Config()


def test_every_recipe_in_configs_validates():
    for recipe in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(recipe)


def test_dotted_overrides_are_typed():
    config = load_config(None, ["algo.beta=0.04", "rollout.group_size=4", "reward.functions.0.weight=0.5",
                                "trainer.run_name=demo", "data.eval=null"])
    assert config.algo.beta == 0.04 and config.rollout.group_size == 4
    assert config.reward.functions[0].weight == 0.5
    assert config.trainer.run_name == "demo" and config.data.eval is None


def test_an_override_that_is_not_yaml_names_itself():
    with pytest.raises(ConfigError, match=r"override algo.lr: '\[' is not a YAML value"):
        load_config(None, ["algo.lr=["])


def test_resolved_config_round_trips_through_yaml():
    config = load_config(None, ["algo.lr=3e-5"])
    assert Config.model_validate(yaml.safe_load(dump_config(config))) == config


@pytest.mark.parametrize(
    "override,field,value",
    [
        ("algo.betta=0.1", "algo.betta", "0.1"),
        ("rollout.group_size=1", "rollout.group_size", "1"),
        ("algo.lr=fast", "algo.lr", "'fast'"),
        ("data.train=missing.jsonl", "data.train", "'missing.jsonl'"),
        ("algo.minibatch_size=12", "algo.minibatch_size", "12"),
        ("reward.functions.0.name=nosuch.module:fn", "reward.functions.0.name", "nosuch.module:fn"),
        ("reward.accuracy_from=other", "reward", "other"),
        ("model.path=./no/such/model", "model.path", "./no/such/model"),
    ],
)
def test_invalid_values_name_the_field_and_value(override, field, value):
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    message = str(error.value)
    assert field in message and value in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_hub_ids_pass_validation_without_network():
    assert load_config(None, ["model.path=Qwen/Qwen2.5-0.5B-Instruct"]).model.path == "Qwen/Qwen2.5-0.5B-Instruct"


def run_launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_dist.launch", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_cli_bad_config_exits_2_naming_the_field_before_ray_starts():
    result = run_launch("rollout.group_size=1")
    assert result.returncode == 2
    assert "rollout.group_size" in result.stderr and "1" in result.stderr
    assert "Ray" not in result.stderr + result.stdout  # nothing was started


def test_float16_is_refused_naming_the_field_and_why_before_ray_starts():
    with pytest.raises(ConfigError, match=r"model\.dtype = 'float16': float16 is refused: nothing scales the loss"):
        load_config(None, ["model.dtype=float16"])
    assert load_config(None, ["model.dtype=bfloat16"]).model.dtype == "bfloat16"
    reward_model = "reward.functions=[{name: reward_model, kwargs: {path: org/some-reward-model, dtype: float16}}]"
    assert load_config(None, [reward_model, "reward.accuracy_from=reward_model"])  # inference only: no loss to scale
    result = run_launch("model.dtype=float16")
    assert (result.returncode, result.stderr.count("\n")) == (2, 1), result.stderr
    assert "model.dtype" in result.stderr and "use bfloat16" in result.stderr
    assert "Ray" not in result.stderr + result.stdout  # nothing was started


def test_cli_print_config_shows_overrides():
    result = run_launch("--config", "configs/default.yaml", "--print-config", "algo.beta=0.02")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["algo"]["beta"] == 0.02


@pytest.mark.parametrize("installed,gpu,resolved", [(True, True, "vllm"), (True, False, "transformers"),
                                                    (False, True, "transformers"), (False, False, "transformers")])
def test_engine_auto_is_vllm_on_gpus_where_installed_and_explicit_vllm_needs_it(monkeypatch, installed, gpu,
                                                                                resolved):
    import torch

    import grpo_dist.config.schema
    import grpo_dist.rollout.worker

    monkeypatch.setattr(grpo_dist.config.schema, "vllm_installed", lambda: installed)
    monkeypatch.setattr(grpo_dist.rollout.worker, "vllm_installed", lambda: installed)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert Config().rollout.engine == "auto"
    assert grpo_dist.rollout.worker.resolve_engine("auto", num_gpus=1.0) == resolved
    assert grpo_dist.rollout.worker.resolve_engine("auto", num_gpus=0.0) == "transformers"  # faster on the CPU
    assert grpo_dist.rollout.worker.resolve_engine("transformers", num_gpus=1.0) == "transformers"
    if installed:
        assert load_config(None, ["rollout.engine=vllm"]).rollout.engine == "vllm"
    else:
        with pytest.raises(ConfigError, match=r"rollout\.engine = 'vllm': vLLM is not installed"):
            load_config(None, ["rollout.engine=vllm"])


def test_vllm_settings_and_tis_cap_are_validated():
    config = load_config(None, ["rollout.vllm.max_model_len=64", "algo.tis_cap=2", "rollout.placement=spread"])
    assert config.rollout.vllm.max_model_len == 64 and config.algo.tis_cap == 2.0
    for override, field in [("rollout.vllm.gpu_memory_utilization=1.5", "rollout.vllm.gpu_memory_utilization"),
                            ("algo.tis_cap=0", "algo.tis_cap"), ("rollout.placement=strict", "rollout.placement")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config(None, [override])


def test_pipeline_and_placement_settings_are_validated():
    config = load_config(None, ["trainer.mode=async", "trainer.max_staleness=2", "rollout.chunk_prompts=4",
                                "reward.resources={sandbox: 1}", "learner.node_labels={pool: gpu}"])
    assert (config.trainer.mode, config.trainer.max_staleness, config.rollout.chunk_prompts) == ("async", 2, 4)
    assert Config().trainer.mode == "sync" and Config().trainer.max_staleness == 1
    for override, field in [("trainer.mode=eager", "trainer.mode"), ("trainer.max_staleness=-1", "trainer.max_staleness"),
                            ("trainer.call_timeout_s=0", "trainer.call_timeout_s"),
                            ("rollout.chunk_prompts=0", "rollout.chunk_prompts"),
                            ("reward.resources={sandbox: x}", "reward.resources")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config(None, [override])
    with pytest.raises(ConfigError, match=r"each reward actor sits in a placement-group bundle: give reward\.num_cpus"):
        load_config(None, ["reward.num_cpus=0"])
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 needs that many GPUs"):
        load_config(None, ["rollout.vllm.tensor_parallel_size=2", "rollout.num_gpus=1"])


def test_recipes_compose_in_order_then_overrides(tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("rollout:\n  group_size: 4\n  temperature: 0.7\nalgo:\n  lr: 0.001\n")
    algo = tmp_path / "algo.yaml"
    algo.write_text("algo:\n  lr: 0.002\n  clip_high: 0.28\n")
    config = load_config([task, algo], ["algo.clip_high=0.3"])
    assert config.rollout.group_size == 4 and config.rollout.temperature == 0.7  # from the task
    assert config.algo.lr == 0.002  # the later file wins
    assert config.algo.clip_high == 0.3  # overrides come last
    assert load_config([algo, task]).algo.lr == 0.001


def test_launch_prints_the_merged_config_of_several_recipes(tmp_path, capsys):
    from grpo_dist.launch import main

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("rollout:\n  group_size: 4\n")
    second.write_text("rollout:\n  group_size: 6\nalgo:\n  beta: 0.04\n")
    assert main(["--config", str(first), "--config", str(second), "--print-config", "algo.lr=0.01"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["group_size"] == 6 and printed["algo"]["beta"] == 0.04 and printed["algo"]["lr"] == 0.01


@pytest.mark.parametrize("overrides,fields", [
    (["algo.ratio_level=sequence", "algo.tis_cap=2"], ["algo.ratio_level", "algo.tis_cap"]),
    (["algo.dynamic_sampling=true"], ["algo.dynamic_sampling_max_rounds"]),
    (["algo.warmup_steps=20", "trainer.steps=10"], ["algo.warmup_steps", "trainer.steps"]),
    (["algo.ref_refresh_every=5"], ["algo.ref_refresh_every", "algo.beta"]),
    (["algo.ref_refresh_every=5", "algo.beta=0.1", "learner.lora.rank=4"], ["algo.ref_refresh_every", "learner.lora"]),
    (["algo.overlong_buffer=0.2", "reward.functions.0.name=length_penalty",
      "reward.functions.0.kwargs={soft_length: 6, max_length: 8}", "reward.accuracy_from=length_penalty"],
     ["algo.overlong_buffer", "length_penalty"]),
    (["learner.num_ranks=2", "learner.num_gpus=0.5"], ["learner.num_ranks", "learner.num_gpus"]),
    (["learner.num_ranks=2", "learner.num_cpus=0"], ["learner.num_ranks", "learner.num_cpus"]),
    (["algo.overlong_buffer=1.5"], ["algo.overlong_buffer"]),
    (["learner.lora.rank=0"], ["learner.lora.rank"]),
    (["algo.lr_schedule=step"], ["algo.lr_schedule"]),
])
def test_combinations_that_cannot_run_name_their_fields(overrides, fields):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert all(field in str(error.value) for field in fields), str(error.value)


def test_cli_refuses_an_incompatible_combination_with_exit_2_before_ray_starts():
    result = run_launch("algo.dynamic_sampling=true")
    assert result.returncode == 2 and "algo.dynamic_sampling_max_rounds" in result.stderr
    assert "Ray" not in result.stderr + result.stdout


def test_an_unset_optional_section_takes_dotted_overrides():
    config = load_config(None, ["learner.lora.rank=4", "learner.lora.target_modules=[q_proj, v_proj]"])
    assert config.learner.lora.rank == 4 and config.learner.lora.alpha == 16.0
    assert config.learner.lora.target_modules == ["q_proj", "v_proj"]
    assert load_config(None).learner.lora is None


def test_lora_without_peft_names_the_field_and_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ConfigError, match=r"learner\.lora.*peft is not installed.*\[lora\]"):
        load_config(None, ["learner.lora.rank=4"])
