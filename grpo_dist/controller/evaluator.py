"""The run's evaluations on the held-out rows, evaluated again when an actor dies or hangs during one.

evaluation.py measures (as `python -m grpo_dist.eval` does); this module runs it inside a run,
where Retry (retry.py) gets back the actors an evaluation lost, and the publisher gives the
rollout workers among them the current weights.
"""

from __future__ import annotations

import itertools
from typing import Any

from grpo_dist.config.schema import Config
from grpo_dist.controller.publish import WeightPublisher
from grpo_dist.controller.retry import Retry
from grpo_dist.observe.evaluation import evaluate
from grpo_dist.observe.metrics import MetricsLog
from grpo_dist.common.types import Prompt
from grpo_dist.common.waits import ActorLost, CallTimeout, ObjectLost, first_line


class Evaluator:
    """Greedy accuracy of the policy the engines serve on `prompts`, logged as an eval record."""

    def __init__(self, config: Config, prompts: list[Prompt], rollouts: list[Any], rewards: list[Any],
                 retry: Retry, publisher: WeightPublisher) -> None:
        self.config, self.prompts = config, prompts
        self.rollouts, self.rewards, self.retry, self.publisher = rollouts, rewards, retry, publisher

    def evaluate(self, step: int, log: MetricsLog) -> float:
        """Greedy accuracy on the held-out rows (evaluation.evaluate, as `python -m grpo_dist.eval` runs it).

        Its engine calls queue behind the latest weight push, so it measures the latest version pushed.
        An actor that dies or hangs during it is revived (a hung one killed first) and the evaluation
        runs again.
        """
        if not self.prompts:
            return float("nan")
        max_restarts, timeout_s = self.config.cluster.max_restarts, self.config.trainer.call_timeout_s
        for attempt in itertools.count():
            self.publisher.catch_up()
            try:
                metrics = evaluate(self.rollouts, self.rewards, self.prompts, self.config)
                break
            except (ActorLost, ObjectLost, CallTimeout) as failed:  # an actor died or hung, or a node died
                if attempt >= max_restarts:
                    raise
                self.publisher.repair(self.retry.recover(failed, grace_s=timeout_s))  # (else raises `failed`)
                hung = "; the actors that hung were restarted" if isinstance(failed, CallTimeout) else ""
                log.note(f"evaluation at step {step}: {first_line(failed)}{hung}; evaluating again")
        log.log_eval(step, metrics)
        return metrics["eval/accuracy"]
