"""Held-out evaluation through the rollout engines: greedy accuracy, pass@k, mean reward.

`evaluate` is the one code path: the trainer's periodic evaluation calls it with the run's
actors, and `python -m grpo_dist.eval` (eval.py) with actors it starts on a policy. The rows
are split over the rollout workers as training splits a step (batches.contiguous_shares: contiguous,
nearly equal shares); each share's groups go from its engine to a reward actor by reference,
and only a few numbers per row come back to the driver (chunk_stats.per_group).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from grpo_dist.config.schema import Config
from grpo_dist.controller.batches import contiguous_shares
from grpo_dist.env.runner import solved_shares
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import Prompt, SamplingSettings
from grpo_dist.common.waits import fetch

# Evaluation samples from the streams of this step number, which no training step uses, and
# seeds each prompt by its index in the split: the samples do not depend on how the rows are
# divided among the workers.
EVAL_STEP = -1


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct among n samples (Chen et al. 2021):

        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)

    the product form avoids the huge binomials.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def standard_error(accuracy: float, n: int) -> float:
    """sqrt(p (1 - p) / n): the binomial standard error of an accuracy over n rows."""
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / max(n, 1))


def episode_success(solved_turns: list[float]) -> dict[str, float]:
    """Multi-turn evaluation where the environment reports `correct` (chunk_stats.per_group's
    solved_turn): eval/solved (success within env.max_turns), eval/solved_after_turn1 (the share
    of rows solved at turn 2 or later) and eval/later_turn_share (of the solved rows); {} else."""
    judged = [turn for turn in solved_turns if turn >= 0]
    if not judged:
        return {}
    return solved_shares(len(judged), sum(t >= 1 for t in judged), sum(t >= 2 for t in judged), "eval")


def score_rows(rollouts: list[Any], rewards: list[Any], prompts: list[Prompt], sampling: SamplingSettings,
               config: Config) -> dict[str, list[float]]:
    """Generate one group per prompt and score it; per row, in prompt order, what
    chunk_stats.per_group keeps (correct: by reward.accuracy_from). Waiting longer than
    trainer.call_timeout_s raises CallTimeout."""
    seed, timeout_s = config.trainer.seed, config.trainer.call_timeout_s
    seeds = {prompt.index: prompt_seed(seed, EVAL_STEP, prompt.index) for prompt in prompts}
    shares = [share for share in contiguous_shares(prompts, len(rollouts)) if share]
    summaries = []
    for index, share in enumerate(shares):
        groups = rollouts[index].generate.remote(share, sampling, [seeds[p.index] for p in share])
        summaries.append(rewards[index % len(rewards)].score_for_evaluation.remote(groups, config.reward.accuracy_from))
    names = [f"rollout worker {i} -> reward actor {i % len(rewards)}: evaluation" for i in range(len(shares))]
    rows: dict[str, list[float]] = {}
    for summary in fetch(summaries, names, timeout_s):
        for key, values in summary.items():
            rows.setdefault(key, []).extend(values)
    return rows


def evaluate(rollouts: list[Any], rewards: list[Any], prompts: list[Prompt], config: Config,
             ks: tuple[int, ...] = (), temperature: float | None = None) -> dict[str, float]:
    """Score `prompts` with the configured rewards through the rollout workers' engines.

    Greedy decoding gives `eval/accuracy` (with its standard error) and `eval/mean_reward`;
    with `ks`, n = max(ks) samples per row at `temperature` (default: rollout.temperature)
    give `eval/pass@k` for each k, averaged over the rows.
    """
    clock = time.perf_counter()
    greedy = score_rows(rollouts, rewards, prompts, sampling_settings(config.rollout, greedy=True), config)
    rows = len(greedy["first_correct"])
    accuracy = sum(greedy["first_correct"]) / rows
    metrics = {
        "eval/accuracy": accuracy,
        "eval/accuracy_stderr": standard_error(accuracy, rows),
        "eval/rows": rows,
        "eval/mean_reward": sum(greedy["first_reward"]) / rows,
        **episode_success(greedy.get("solved_turn", [])),
    }
    if ks:
        n = max(ks)
        sampling = replace(sampling_settings(config.rollout), n=n,
                           temperature=config.rollout.temperature if temperature is None else temperature)
        correct = [int(c) for c in score_rows(rollouts, rewards, prompts, sampling, config)["correct"]]
        for k in sorted(ks):
            metrics[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
    metrics["time/eval_s"] = time.perf_counter() - clock
    return metrics
