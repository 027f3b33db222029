"""configs/smollm2_word_problems.yaml: its task's splits (deterministic, disjoint, right answers,
the shipped files), two GRPO steps of the recipe through the launcher on the real model, and a
run of it killed after a checkpoint and resumed that ends bit for bit where the straight run does."""

import json
from pathlib import Path

import pytest

from grpo_dist.config.schema import load_config, vllm_installed
from grpo_dist.tasks.data import read_jsonl
from grpo_dist.tasks.word_problems import answer, make_splits
from runs import ROOT, finish, start, train_records
from test_reproducible import trained
from test_resume import kill_9_after, max_weight_difference

RECIPE = ROOT / "configs" / "smollm2_word_problems.yaml"
# The recipe shortened (its features as they are: two learner and two rollout threads, AdamW):
# 2 prompts x 2 completions of up to 8 tokens, 2 steps, a checkpoint after each, held-out
# evaluations of 2 rows at steps 0 and 2.
SHORT = ["rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "data.eval_rows=2",
         "trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=1", "trainer.save_final=false",
         "trainer.progress=false", "trainer.loggers=[jsonl]", "cluster.address=local", "cluster.num_cpus=2"]


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


def recipe(real_model: Path, engine: str) -> list[str]:
    return ["--config", str(RECIPE), f"model.path={real_model}", f"rollout.engine={engine}", *SHORT]


def launch(output_dir: Path, *args: str) -> Path:
    """Run the launcher to the end into output_dir/run (exit 0); the run's folder."""
    log = output_dir / "launch.log"
    code, output = finish(start(*args, f"trainer.output_dir={output_dir}", "trainer.run_name=run", log=log),
                          timeout=400, log=log)
    assert code == 0, output[-3000:]
    return output_dir / "run"


@pytest.fixture(scope="module")
def straight(real_model, tmp_path_factory) -> Path:
    """The transformers engine's two steps, straight through: the recipe test's run and the resume test's reference."""
    return launch(tmp_path_factory.mktemp("straight"), *recipe(real_model, "transformers"))


def assert_two_steps_and_two_evaluations(run_dir: Path) -> None:
    records = train_records(run_dir)
    assert [r["step"] for r in records] == [1, 2] and all(r["rollout/completion_length"] > 0 for r in records)
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r["kind"] == "eval"] == [0, 2]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_steps_of_the_recipe_on_the_real_model_through_the_launcher(straight):
    assert_two_steps_and_two_evaluations(straight)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_two_steps_of_the_recipe_on_the_real_model_with_vllm(real_model, tmp_path):
    assert_two_steps_and_two_evaluations(launch(tmp_path, *recipe(real_model, "vllm"), "rollout.threads=1",
                                                "learner.threads=1", "trainer.checkpoint_every=0"))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_recipe_killed_after_step_1_and_resumed_ends_bit_for_bit_where_the_straight_run_does(
        real_model, straight, tmp_path):
    """kill -9 once the checkpoint of step 1 is complete, `--resume`, step 2: every metric that is
    not a clock and the step-2 checkpoint's policy equal the straight run's, with no tolerance."""
    resumed = tmp_path / "b"
    kill_9_after(1, resumed, *recipe(real_model, "transformers"), timeout=400)
    code, output = finish(start("--resume", str(resumed)), timeout=400)
    assert code == 0, output[-3000:]
    expected, records = trained(straight), trained(resumed)
    assert [r["step"] for r in records] == [1, 2]
    for step, (left, right) in enumerate(zip(expected, records), start=1):
        differing = sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
        assert not differing, f"step {step}: {differing}"
    policy = Path("checkpoints", "step_000002", "policy")
    assert max_weight_difference(straight / policy, resumed / policy) == 0.0
