"""What the controller learns about a step's groups without holding them: sums per chunk.

The reward actor that scores a chunk summarises it (`summarize`, a few floats); the
controller adds up the summaries of a step's chunks into the reward/ and rollout/ metrics
(`batch_metrics`). Sums rather than means, so that chunks of any size combine exactly.
"""

from __future__ import annotations

import math

from grpo_dist.env.base import solved_turn
from grpo_dist.common.types import Group

FAILURES = "/failures"
FIRST_ERROR = "/first_error"  # a reward function's first error in a chunk (a text)
PART_SUM = "/sum"


def is_correct(value: float) -> bool:
    """A completion counts as correct when the `reward.accuracy_from` function gave it 1."""
    return value >= 1.0


def summarize(groups: list[Group], accuracy_from: str) -> dict[str, float]:
    """Counts and sums of one scored chunk; `accuracy_from`'s score 1.0 counts as correct."""
    completions = [c for g in groups for c in g.completions]
    rewards = [r for g in groups for r in g.rewards]
    summary = {
        "groups": float(len(groups)),
        "completions": float(len(completions)),
        "tokens": float(sum(len(c.token_ids) if c.loss_mask is None else sum(c.loss_mask) for c in completions)),
        "truncated": float(sum(c.finish_reason == "length" for c in completions)),
        "reward_sum": sum(rewards),
        "reward_sq_sum": sum(r * r for r in rewards),
        "correct": float(sum(is_correct(v) for g in groups for v in g.reward_parts[accuracy_from])),
    }
    for name in groups[0].reward_parts if groups else ():
        summary[f"reward/{name}{PART_SUM}"] = sum(v for g in groups for v in g.reward_parts[name])
    return summary


def per_group(groups: list[Group], accuracy_from: str) -> dict[str, list[float]]:
    """What evaluation needs of each scored group, small: its correct samples, and the first
    sample's reward and correctness (the greedy one when a group holds one sample). Episodes also
    give `solved_turn`: the turn that solved the first sample's episode (env/base.solved_turn: 0
    unsolved, -1 when its environment does not report `correct`)."""
    rows = {
        "correct": [float(sum(map(is_correct, g.reward_parts[accuracy_from]))) for g in groups],
        "first_correct": [float(is_correct(g.reward_parts[accuracy_from][0])) for g in groups],
        "first_reward": [g.rewards[0] for g in groups],
    }
    if groups and groups[0].completions[0].episode is not None:
        turns = [solved_turn(g.completions[0].episode["env_info"]) for g in groups]  # type: ignore[index]
        rows["solved_turn"] = [-1.0 if turn is None else float(turn) for turn in turns]
    return rows


def add(summaries: list[dict[str, float]]) -> dict[str, float]:
    """Key-wise sum of several chunks' summaries (of a text, such as a first error: the first)."""
    total: dict[str, float] = {}
    for summary in summaries:
        for key, value in summary.items():
            total[key] = total.setdefault(key, value) if isinstance(value, str) else total.get(key, 0.0) + value
    return total


def every_sample_failed(infos: list[dict[str, float]], stats: list[dict[str, float]]) -> str | None:
    """What failed on every sample of a batch, with its first error, from its chunks' generation
    infos and scoring stats: every episode, or one reward function on every completion; None when
    something scored (a batch like this trains on nothing: trainer.max_bad_steps counts it)."""
    episodes, failed = (sum(info.get(key, 0.0) for info in infos) for key in ("env/episodes", "env/failed"))
    if episodes and failed == episodes:
        first = next(info["first_env_error"] for info in infos if "first_env_error" in info)
        return f"every episode failed ({episodes:.0f}), the first: {one_line(first)}"
    total = add(stats)
    for key, value in total.items():
        if key.endswith(FAILURES) and value == total["completions"] > 0:
            name = key.removeprefix("reward/").removesuffix(FAILURES)
            return (f"reward function {name} failed on every sample ({value:.0f}), the first: "
                    f"{one_line(str(total.get(f'reward/{name}{FIRST_ERROR}')))}")
    return None


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (whitespace runs as one space), cut to `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def batch_metrics(summaries: list[dict[str, float]]) -> dict[str, float]:
    """The reward/ and rollout/ metrics of the chunks `summaries` describe, taken together."""
    total = add(summaries)
    n = total["completions"]
    mean = total["reward_sum"] / n  # mean(r)
    metrics = {
        "reward/mean": mean,
        "reward/std": math.sqrt(max(total["reward_sq_sum"] / n - mean * mean, 0.0)),  # sqrt(E[r^2] - E[r]^2)
        "reward/accuracy": total["correct"] / n,
        "rollout/completion_length": total["tokens"] / n,
        "rollout/truncated_fraction": total["truncated"] / n,
    }
    for key, value in total.items():
        if key.startswith("reward/") and key.endswith(PART_SUM):
            metrics[key.removesuffix(PART_SUM) + "/mean"] = value / n
        elif key.startswith("reward/") and key.endswith(FAILURES):
            metrics[key] = value
    return metrics


def informative(groups: list[Group]) -> list[bool]:
    """grpo.informative_groups of each group's rewards, compared in float32 as the learner
    compares them for its advantages (so a group kept here never gets zero advantages there)."""
    if not groups:
        return []
    import torch  # here: a reward actor imports torch only for dynamic sampling (seconds at its start)

    from grpo_dist.grpo import informative_groups

    rewards = torch.tensor([reward for group in groups for reward in group.rewards], dtype=torch.float32)
    return informative_groups(rewards, len(groups[0].rewards)).tolist()
