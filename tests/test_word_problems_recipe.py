"""configs/smollm2_word_problems.yaml: its task's splits (deterministic, disjoint, right answers,
the shipped files) and two GRPO steps of the recipe through the launcher on the real model."""

import json

import pytest

from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import read_jsonl
from grpo_dist.tasks.word_problems import answer, make_splits
from runs import ROOT, finish, start, train_records

RECIPE = ROOT / "configs" / "smollm2_word_problems.yaml"


def test_the_splits_are_deterministic_disjoint_and_the_shipped_files():
    train, held_out = make_splits(seed=0)
    assert (train, held_out) == make_splits(seed=0) and make_splits(seed=1) != (train, held_out)
    keys = [{(r["operation"], *r["numbers"]) for r in rows} for rows in (train, held_out)]
    assert len(keys[0]) == len(train) and len(keys[1]) == len(held_out) == 300
    assert not keys[0] & keys[1] and not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(r["answer"] == str(answer(r["operation"], *r["numbers"])) for r in train + held_out)
    config = load_config(RECIPE)
    assert read_jsonl(config.data.train) == train and read_jsonl(config.data.eval) == held_out


def test_the_recipe_names_the_chat_template_a_system_prompt_and_math_answer():
    config = load_config(RECIPE)
    assert config.data.chat_template == "true" and "The answer is" in config.data.system_prompt
    assert [f.name for f in config.reward.functions] == ["math_answer"] and config.reward.accuracy_from == "math_answer"


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_two_steps_of_the_recipe_on_the_real_model_through_the_launcher(real_model, tmp_path, engine):
    log = tmp_path / "launch.log"
    run = start("--config", str(RECIPE), f"model.path={real_model}", f"rollout.engine={engine}",
                "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                "rollout.threads=1", "learner.threads=1", "data.eval_rows=2", "trainer.steps=2",
                "trainer.eval_every=2", "trainer.save_final=false", "trainer.progress=false",
                "trainer.loggers=[jsonl]", "cluster.address=local", "cluster.num_cpus=2",
                f"trainer.output_dir={tmp_path}", "trainer.run_name=run", log=log)
    code, output = finish(run, timeout=400, log=log)
    assert code == 0, output[-3000:]
    records = train_records(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2] and all(r["rollout/completion_length"] > 0 for r in records)
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r["kind"] == "eval"] == [0, 2]
