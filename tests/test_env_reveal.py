"""env/arithmetic_reveal.py against hand-worked episodes, and the solved-at-turn metrics of
multi-turn training (env/runner.py) and evaluation (reward/chunk_stats.py, evaluation.py)."""

from types import SimpleNamespace

import pytest

from grpo_dist.env.arithmetic_reveal import ArithmeticReveal, hide_addend
from grpo_dist.env.base import check_step, solved_turn
from grpo_dist.env.registry import load_environment
from grpo_dist.env.runner import Episode, env_metrics, episode_sums
from grpo_dist.observe.evaluation import episode_success
from grpo_dist.reward.chunk_stats import per_group
from grpo_dist.common.types import Completion, Group

ROW = {"prompt": "58+67=", "answer": "125"}


def test_the_second_addend_is_revealed_after_the_first_reply():
    assert load_environment("arithmetic_reveal") is ArithmeticReveal
    env = ArithmeticReveal()
    assert env.reset(ROW) == "58+="
    guess = check_step(env.step("<answer>58</answer>"))
    assert (guess.observation, guess.reward, guess.done) == ("58+67=", 0.0, False)
    assert guess.info == {"attempt": 1, "correct": False}
    right = check_step(env.step("<answer>125</answer>"))
    assert (right.reward, right.done, right.info) == (1.0, True, {"attempt": 2, "correct": True})


def test_a_lucky_guess_ends_the_episode_and_a_wrong_second_answer_hears_the_question_again():
    lucky = ArithmeticReveal()
    assert lucky.reset({"prompt": "7+0=", "answer": "7"}) == "7+="
    assert check_step(lucky.step("<answer>7</answer>")).done
    env = ArithmeticReveal()
    env.reset(ROW)
    env.step("no tags at all")
    again = check_step(env.step("<answer>15</answer>"))  # the carry dropped
    assert (again.observation, again.reward, again.done, again.info["attempt"]) == ("58+67=", 0.0, False, 2)
    with pytest.raises(ValueError, match="not a sum"):
        hide_addend("58-67=")


def test_solved_turn_reads_the_steps_correct_flags():
    assert solved_turn([{"correct": False}, {"correct": True}]) == 2
    assert solved_turn([{"correct": True}]) == 1
    assert solved_turn([{"correct": False}, {"correct": False}]) == 0
    assert solved_turn([{"calls": 1}]) is None and solved_turn([]) is None


def episode(infos: list[dict]) -> Episode:
    ended = SimpleNamespace(stop_reason="done", observations_truncated=0)  # the trajectory's counts only
    return Episode(0, 0, 0, trajectory=ended, infos=infos, replies=["r"] * len(infos))  # type: ignore[arg-type]


def test_training_metrics_count_the_episodes_solved_after_turn_1():
    first, second, never = [{"correct": True}], [{"correct": False}, {"correct": True}], [{"correct": False}] * 2
    sums = [episode_sums([episode(first), episode(second)]), episode_sums([episode(second), episode(never)])]
    metrics = env_metrics(sums)
    assert metrics["env/solved"] == 3 / 4 and metrics["env/solved_after_turn1"] == 2 / 4
    assert metrics["env/later_turn_share"] == 2 / 3 and "env/judged" not in metrics
    assert "env/solved" not in env_metrics([episode_sums([episode([{"calls": 1}])])])  # no correct reported


def group(infos: list[dict] | None, reward: float) -> Group:
    record = None if infos is None else {"env_info": infos}
    completion = Completion(token_ids=[1], logprobs=[0.0], text="", finish_reason="stop", episode=record)
    scored = Group(prompt_index=0, row={}, prompt="", prompt_ids=[1], completions=[completion], policy_version=0)
    scored.rewards, scored.reward_parts = [reward], {"env_reward": [reward]}
    return scored


def test_evaluation_measures_success_within_max_turns_and_leaves_single_turn_alone():
    groups = [group([{"correct": False}, {"correct": True}], 1.0), group([{"correct": True}], 1.0),
              group([{"correct": False}] * 2, 0.0), group([{"correct": False}, {"correct": True}], 1.0)]
    rows = per_group(groups, "env_reward")
    assert rows["solved_turn"] == [2.0, 1.0, 0.0, 2.0] and rows["first_correct"] == [1.0, 1.0, 0.0, 1.0]
    assert episode_success(rows["solved_turn"]) == {"eval/solved": 0.75, "eval/solved_after_turn1": 0.5,
                                                    "eval/later_turn_share": 2 / 3}
    assert "solved_turn" not in per_group([group(None, 1.0)], "env_reward")  # single-turn: as before
    assert episode_success([]) == {} and episode_success([-1.0, -1.0]) == {}  # no correct reported
