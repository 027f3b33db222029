"""The run's evaluations on the held-out rows, evaluated again when an actor dies or hangs during one.

evaluation.py measures (as `python -m grpo_dist.eval` does); this module runs it inside a run,
where the Supervisor (recovery.py) revives the actors an evaluation lost.
"""

from __future__ import annotations

import itertools
from typing import Any

from grpo_dist.config.schema import Config
from grpo_dist.controller.recovery import Supervisor
from grpo_dist.observe.evaluation import evaluate
from grpo_dist.observe.metrics import MetricsLog
from grpo_dist.common.types import Prompt
from grpo_dist.common.waits import ActorLost, CallTimeout, ObjectLost, first_line


class Evaluator:
    """Greedy accuracy of the policy the engines serve on `prompts`, logged as an eval record."""

    def __init__(self, config: Config, prompts: list[Prompt], rollouts: list[Any], rewards: list[Any],
                 supervisor: Supervisor) -> None:
        self.config, self.prompts = config, prompts
        self.rollouts, self.rewards, self.supervisor = rollouts, rewards, supervisor

    def evaluate(self, step: int, log: MetricsLog) -> float:
        """Greedy accuracy on the held-out rows (evaluation.evaluate, as `python -m grpo_dist.eval` runs it).

        Its engine calls queue behind the latest weight push, so it measures the latest version pushed.
        An actor that dies or hangs during it is revived (a hung one killed first) and the evaluation
        runs again.
        """
        if not self.prompts:
            return float("nan")
        max_restarts = self.config.cluster.max_restarts
        for attempt in itertools.count():
            self.supervisor.catch_up()
            try:
                metrics = evaluate(self.rollouts, self.rewards, self.prompts, self.config)
                break
            except (ActorLost, ObjectLost) as lost:  # an actor died, or a node with its results
                where = self.supervisor.which(lost)
                if attempt >= max_restarts or (where is None and isinstance(lost, ActorLost)):
                    raise
                log.note(f"evaluation at step {step}: {first_line(lost)}; evaluating again")
                if where is not None:
                    self.supervisor.revive(*where)  # (else catch_up, above, finds the restarted actors)
            except CallTimeout as late:  # an actor hung: killed and revived, or the run ends
                if attempt >= max_restarts or not self.supervisor.kill_unresponsive(
                        str(late), grace_s=self.config.trainer.call_timeout_s):
                    raise
                log.note(f"evaluation at step {step}: {late}; the actors that hung were restarted; evaluating again")
        log.log_eval(step, metrics)
        return metrics["eval/accuracy"]
