"""The sinks' configuration and formats, without a run (test_observe.py runs one)."""

import importlib.util

import pytest

from grpo_dist.config.schema import ConfigError, load_config
from grpo_dist.observe.metrics import ConsoleSink, sample_records, samples_markdown
from grpo_dist.common.types import Completion, Group


def test_wandb_asked_for_but_not_installed_is_a_config_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"trainer\.loggers.*wandb is not installed"):
        load_config(None, ["trainer.loggers=[jsonl, wandb]"])
    assert load_config(None, ["trainer.loggers=[jsonl]"]).trainer.loggers == ["jsonl"]  # wandb is optional


def test_an_unknown_logger_is_named():
    with pytest.raises(ConfigError, match=r"trainer\.loggers\.1 = 'mlflow'"):
        load_config(None, ["trainer.loggers=[jsonl, mlflow]"])


def test_samples_render_as_markdown_tables_whatever_the_completion_holds():
    records = [{"prompt": "1+1=", "policy_version": 4, "completions": [
        {"text": "<answer>2</answer>", "reward": 1.0, "advantage": 0.7071},
        {"text": "a | b\n`c`", "reward": 0.0, "advantage": -0.7071},
    ]}]
    lines = samples_markdown(records).splitlines()
    assert lines[0] == "**prompt** `1+1=` (policy version 4)"
    assert lines[-1] == "| 1 | 0 | -0.707 | `a \\| b ⏎ 'c'` |"  # one table row: pipes escaped, newline marked


def test_sample_records_carry_each_groups_advantages_by_the_runs_scale():
    def group(rewards: list[float]) -> Group:
        completions = [Completion([1, 2], [-0.5, -0.5], f"c{i}", "stop") for i in range(len(rewards))]
        return Group(0, {"prompt": "p"}, "p", [3], completions, policy_version=2, rewards=rewards,
                     reward_parts={"exact_answer": rewards})

    def advantages(scale: str) -> list[list[float]]:
        records = sample_records([group([1.0, 0.0, 0.0, 0.0]), group([0.7] * 4)], step=3, scale=scale)
        return [[c["advantage"] for c in record["completions"]] for record in records]

    # mean 0.25; Bessel's std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; eps 1e-6; equal rewards: none at all
    none, std = advantages("none"), advantages("std")
    assert none[0] == pytest.approx([0.75, -0.25, -0.25, -0.25]) and none[1] == [0.0] * 4
    assert std[0] == pytest.approx([0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001], rel=1e-6)
    assert std[1] == [0.0] * 4


def test_the_console_without_a_progress_bar_prints_every_tenth_step_and_each_evaluation(capsys):
    console = ConsoleSink(steps=20, progress=False)
    for step in range(1, 21):
        console.scalars("train", step, {"reward/mean": 0.5, "time/step_s": 1.25})
    console.scalars("eval", 20, {"eval/accuracy": 0.75, "eval/accuracy_stderr": 0.05, "eval/rows": 100})
    assert capsys.readouterr().out.splitlines() == [
        "step   10  reward=0.5 s/step=1.25", "step   20  reward=0.5 s/step=1.25",
        "step   20  held-out accuracy 0.750 ± 0.050 (100 rows)",
    ]

