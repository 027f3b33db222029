"""Evaluation: pass@k against hand computations, the checkpoint argument, and `evaluate` on
real rollout and reward actors: greedy accuracy with a non-binary reward, and pass@k at
temperature 0.7 against the closed form, with a reward that makes a known number of each
prompt's samples correct."""

import math

import pytest
import ray

from conftest import ENGINES, small_config
from reward_helpers import known_correct_count
from grpo_dist.config.schema import BUILTIN_ROOT, Config, ConfigError, dump_config, effective_reward
from grpo_dist.tasks.data import held_out_prompts
from grpo_dist.controller.actors import Actors
from grpo_dist.eval import main, parse_ks, resolve_checkpoint
from grpo_dist.observe.evaluation import evaluate, pass_at_k
from grpo_dist.reward.worker import RewardWorker

MODEL = BUILTIN_ROOT / "arithmetic" / "model"
PASS_AT_N = 4  # samples per prompt for pass@k


def test_pass_at_k_matches_hand_computations():
    # n=5 samples, c=2 correct, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is c/n
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c < k: every 3 of 5 holds a correct one
    for n, c, k in [(8, 3, 4), (20, 1, 10), (200, 17, 50)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_parse_ks_accepts_a_list_and_names_bad_input():
    assert parse_ks("8,1,4") == (1, 4, 8) and parse_ks(None) == ()
    for bad in ("1,x", "0,2"):
        with pytest.raises(ConfigError, match="--k"):
            parse_ks(bad)


def copy_model(target):
    target.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (target / name).write_bytes((MODEL / name).read_bytes())


def test_checkpoint_is_a_model_folder_a_run_directory_or_a_checkpoint(tmp_path):
    folder, config = resolve_checkpoint(str(MODEL), [], ["data.eval_rows=5"])
    assert folder == MODEL and config.model.path == str(MODEL.resolve()) and config.data.eval_rows == 5

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(dump_config(small_config(tmp_path, "rollout.max_new_tokens=6")))
    with pytest.raises(ConfigError, match="no policy in"):
        resolve_checkpoint(str(run_dir), [], [])
    copy_model(run_dir / "final")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rollout:\n  temperature: 0.5\n")
    folder, config = resolve_checkpoint(str(run_dir), [str(recipe)], [])
    assert folder == run_dir / "final"
    assert config.rollout.max_new_tokens == 6 and config.rollout.temperature == 0.5  # the run's, then the recipe

    step = run_dir / "checkpoints" / "step_000002"
    copy_model(step / "policy")
    (step / "config.yaml").write_text(dump_config(small_config(tmp_path, "rollout.max_new_tokens=7")))
    folder, config = resolve_checkpoint(str(step), [], [])
    assert folder == step / "policy" and config.rollout.max_new_tokens == 7

    with pytest.raises(ConfigError, match="neither a model folder"):
        resolve_checkpoint(str(tmp_path), [], [])


def test_the_command_exits_2_before_starting_ray(ray_stopped, tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path)]) == 2
    model = str(MODEL)
    assert main(["--checkpoint", model, "--temperature", "0.5"]) == 2  # a temperature without --k
    assert main(["--checkpoint", model, "data.eval=null"]) == 2
    assert "data.eval" in capsys.readouterr().err
    assert not ray.is_initialized()


# Rewards for greedy accuracy: the exact answer (1) plus half a point for the answer format: 0, 0.5 or 1.5.
GRADED = "reward.functions=[{name: exact_answer}, {name: answer_format, weight: 0.5, " \
         "kwargs: {pattern: '<answer>[0-9]+</answer>'}}]"
# A reward that makes a known number of each group's samples correct (tests/reward_helpers.py).
KNOWN = (f"reward.functions=[{{name: 'reward_helpers:first_correct', kwargs: {{group_size: {PASS_AT_N}}}}}]",
         "reward.accuracy_from=reward_helpers:first_correct")


def eval_config(output_dir, engine: str, *reward: str) -> Config:
    return small_config(output_dir, f"rollout.engine={engine}", "data.eval_rows=16", "rollout.temperature=0.7",
                        # one vLLM engine on 2 cores: 31 s rather than 48
                        f"rollout.num_workers={2 if engine == 'transformers' else 1}", *reward)


@pytest.fixture(scope="module", params=ENGINES)
def evaluation(request, ray_cluster, tmp_path_factory):
    """Rollout and reward actors of one engine (rewards: GRADED), their config and 16 held-out prompts."""
    config = eval_config(tmp_path_factory.mktemp("eval"), request.param, GRADED)
    actors = Actors.start(config, learner=False)
    yield config, actors.rollouts, actors.rewards, held_out_prompts(config)
    actors.stop()


def test_evaluate_scores_greedy_completions(evaluation):
    config, rollouts, rewards, prompts = evaluation
    metrics = evaluate(rollouts, rewards, prompts, config)
    assert metrics["eval/rows"] == 16 and 0 < metrics["eval/accuracy"] < 1
    # every greedy completion is in the answer format here, so the reward is accuracy + 0.5
    assert metrics["eval/mean_reward"] == pytest.approx(metrics["eval/accuracy"] + 0.5)
    assert metrics["eval/accuracy_stderr"] == pytest.approx(math.sqrt(
        metrics["eval/accuracy"] * (1 - metrics["eval/accuracy"]) / 16))


def test_pass_at_k_of_sampled_completions_is_the_closed_form_of_the_known_counts(evaluation, tmp_path):
    graded, rollouts, _, prompts = evaluation
    config = eval_config(tmp_path, graded.rollout.engine, *KNOWN)
    known = ray.remote(RewardWorker).options(num_cpus=0).remote(effective_reward(config))  # the same engines
    try:
        metrics = evaluate(rollouts, [known], prompts, config, ks=(1, 2, PASS_AT_N))
    finally:
        ray.kill(known)
    # c of the n = PASS_AT_N samples of each prompt are correct; the greedy one iff c >= 1
    correct = [known_correct_count(prompt.text, PASS_AT_N) for prompt in prompts]
    assert len(set(correct)) >= 3, correct  # the rows differ: the average is not one value's
    assert metrics["eval/accuracy"] == pytest.approx(sum(c >= 1 for c in correct) / len(correct))
    for k in (1, 2, PASS_AT_N):
        expected = sum(1 - math.comb(PASS_AT_N - c, k) / math.comb(PASS_AT_N, k) for c in correct) / len(correct)
        assert metrics[f"eval/pass@{k}"] == pytest.approx(expected, abs=1e-12), k
