"""The published variants as recipes (configs/algos/): they compose with any task, their pieces
match the papers' formulas, and each learns the built-in task (slow)."""

import json
from pathlib import Path

import pytest
import yaml

from grpo_dist.config.schema import Config, ConfigError, effective_reward, load_config
from grpo_dist.reward.rules import length_penalty
from grpo_dist.controller.run import TrainingRun
from learner_helpers import make_config, make_learner, scored_groups

ROOT = Path(__file__).resolve().parent.parent
ALGOS = sorted((ROOT / "configs" / "algos").glob("*.yaml"))
TASKS = sorted((ROOT / "configs").glob("*.yaml"))
EXPECTED = {  # what defines each algorithm
    "grpo": {"aggregation": "sequence_mean", "advantage_scale": "std", "clip_high": 0.2, "beta": 0.04,
             "ratio_level": "token"},
    "dapo": {"aggregation": "token_mean", "clip_low": 0.2, "clip_high": 0.28, "beta": 0.0, "dynamic_sampling": True,
             "mask_truncated": True, "overlong_buffer": 0.2},
    "dr_grpo": {"aggregation": "constant", "advantage_scale": "none", "beta": 0.0},
    "gspo": {"ratio_level": "sequence", "aggregation": "sequence_mean", "clip_low": 3e-4, "clip_high": 4e-4},
}
# Multi-turn tasks (env or agent set) refuse what is sized by rollout.max_new_tokens, one turn's limit.
REFUSED_MULTI_TURN = {"dapo": "algo.overlong_buffer", "dr_grpo": "algo.aggregation=constant"}


def test_there_are_the_four_recipes_each_naming_its_paper():
    assert [path.stem for path in ALGOS] == sorted(EXPECTED)
    for path in ALGOS:
        text = path.read_text()
        assert "arXiv:" in text.split("\nalgo:")[0], path.name
        assert set(yaml.safe_load(text)) == {"algo"}, f"{path.name} holds more than the algorithm"


@pytest.mark.parametrize("task", TASKS, ids=lambda p: p.stem)
@pytest.mark.parametrize("algo", ALGOS, ids=lambda p: p.stem)
def test_every_recipe_composes_with_every_task(task, algo):
    alone = load_config(task)
    if alone.episodes is not None and algo.stem in REFUSED_MULTI_TURN:  # sized by one turn, not by an episode
        with pytest.raises(ConfigError, match=REFUSED_MULTI_TURN[algo.stem]):
            load_config([task, algo])
        return
    composed = load_config([task, algo])
    assert composed.model_dump(exclude={"algo"}) == alone.model_dump(exclude={"algo"})  # the task is untouched
    assert composed.algo.lr == alone.algo.lr  # the task's learning rate stays the task's
    for field, value in EXPECTED[algo.stem].items():
        assert getattr(composed.algo, field) == value, (algo.stem, field)


def test_cli_composes_a_task_and_a_recipe():
    from grpo_dist.launch import main

    assert main(["--config", str(ROOT / "configs/default.yaml"), "--config", str(ROOT / "configs/algos/dapo.yaml"),
                 "--print-config"]) == 0


@pytest.mark.parametrize("tokens,expected", [(16384, 0.0), (17408, -0.25), (18432, -0.5), (20480, -1.0),
                                             (20481, -1.0), (30000, -1.0)])
def test_length_penalty_is_dapos_soft_overlong_punishment(tokens, expected):
    # DAPO eq. 13 with L_max = 20480, L_cache = 4096: 0 up to L_max - L_cache = 16384, then
    # ((L_max - L_cache) - |y|) / L_cache, and -1 beyond L_max
    assert length_penalty("", "", completion_tokens=tokens, soft_length=16384, max_length=20480) == expected


@pytest.mark.parametrize("max_new_tokens,soft_length", [(20480, 16384), (8, 6), (2, 1)])
def test_the_overlong_buffer_is_the_last_fraction_of_the_length_limit(max_new_tokens, soft_length):
    config = load_config(None, ["algo.overlong_buffer=0.2", f"rollout.max_new_tokens={max_new_tokens}"])
    functions = effective_reward(config).functions
    assert [f.name for f in functions] == ["exact_answer", "length_penalty"]
    assert functions[1].kwargs == {"soft_length": soft_length, "max_length": max_new_tokens}
    assert effective_reward(Config()) == Config().reward  # off: the task's rewards as they are


def test_truncated_completions_are_counted_and_carry_no_gradient():
    """Two new tokens cut every answer off: masked, nothing is learned; five cut the 3-digit sums only."""
    some = ["algo.mask_truncated=true", "rollout.max_new_tokens=5"]
    groups = scored_groups(make_config(*some))
    truncated = sum(c.finish_reason == "length" for g in groups for c in g.completions)
    assert 0 < truncated < 16
    assert make_learner(*some).train_step(groups)["policy/truncated_masked"] == truncated

    every = ["algo.mask_truncated=true", "rollout.max_new_tokens=2"]
    learner = make_learner(*every)
    before = learner.checksum()
    metrics = learner.train_step(scored_groups(make_config(*every)))
    assert metrics["policy/truncated_masked"] == 16 and metrics["policy/grad_norm"] == 0.0
    assert learner.checksum() == before


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS, ids=lambda p: p.stem)
def test_each_recipe_learns_the_built_in_task(ray_cluster, tmp_path, algo):
    # measured (benchmarks/algorithms.py --eval-rows 200, 2 shared cores): 0.320 before; after 10
    # steps grpo 0.780, dapo 0.735 (with dynamic sampling), dr_grpo 0.765, gspo 0.770 (stderr 0.03); 11-60 s each
    config = load_config([ROOT / "configs" / "default.yaml", algo], [
        "rollout.engine=transformers", "trainer.steps=10", "trainer.eval_every=0", "data.eval_rows=200",
        "trainer.progress=false", "trainer.save_final=false", f"trainer.output_dir={tmp_path}",
        "trainer.run_name=run"])
    summary = TrainingRun(config, tmp_path / "run").run()
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.2, summary
    lines = (tmp_path / "run" / "metrics.jsonl").read_text()
    if algo.stem == "dapo":
        assert "reward/length_penalty/mean" in lines and "policy/truncated_masked" in lines
        steps = [r for r in map(json.loads, lines.splitlines()) if r["kind"] == "train"]
        # it sampled dynamically: uniform groups were dropped and made up for by extra rounds
        assert any(r["rollout/dynamic_dropped_fraction"] > 0 for r in steps)
        assert any(r["rollout/dynamic_rounds"] > 1 and r["rollout/dynamic_extra_completions"] > 0 for r in steps)
        assert all(r["rollout/dynamic_groups"] == 32 or r["rollout/dynamic_bound_reached"] == 1.0 for r in steps)
