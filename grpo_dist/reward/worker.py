"""RewardWorker: scores completions with the configured, weighted reward functions.

Each function runs in a pool of scoring processes with a per-sample deadline, so a reward
that raises, hangs or returns NaN costs that one sample `failure_score` and a counter in
the metrics; it never stops the run.
"""

from __future__ import annotations

from typing import Any

from grpo_dist.config import RewardConfig
from grpo_dist.reward.pool import ScoringPool
from grpo_dist.reward.registry import reward_spec
from grpo_dist.types import Group


def reward_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The row's fields as keyword arguments; `prompt`/`completion` are passed positionally."""
    return {key: value for key, value in row.items() if key not in ("prompt", "completion")}


class RewardWorker:
    """Runs as a Ray actor (see trainer.py); plain class so that it can be used directly."""

    def __init__(self, reward: RewardConfig) -> None:
        self.config = reward
        self.pool = ScoringPool(num_workers=reward.processes, timeout_s=reward.timeout_s)

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        """Fill each group's `rewards` (weighted sum) and `reward_parts` (per function)."""
        items = [
            (group.prompt, completion.text, reward_fields(group.row))
            for group in groups
            for completion in group.completions
        ]
        totals = [0.0] * len(items)
        parts: dict[str, list[float]] = {}
        failures: dict[str, float] = {}
        for function in self.config.functions:
            outcomes = self.pool.score(reward_spec(function.name), items)
            values = [self.config.failure_score if o.error else o.value for o in outcomes]
            failures[f"reward/{function.name}/failures"] = float(sum(o.error is not None for o in outcomes))
            parts[function.name] = values
            totals = [total + function.weight * value for total, value in zip(totals, values)]
        start = 0
        for group in groups:
            end = start + len(group.completions)
            group.rewards = totals[start:end]
            group.reward_parts = {name: values[start:end] for name, values in parts.items()}
            start = end
        return groups, failures

    def close(self) -> None:
        self.pool.close()
