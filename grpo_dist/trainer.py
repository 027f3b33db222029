"""The controller: GRPO with rollouts running up to `max_staleness` policy versions ahead.

    prompts -> RolloutWorker x N -> RewardWorker x M -> Learner -> weights -> RolloutWorker x N

One loop serves both modes; sync mode is async mode with max_staleness 0. Step t:

    collect batch t (pipeline.py)          wait for its chunks' small stats; the groups stay put
    learner.train_step(*refs of batch t)   submitted; Ray resolves the references in the learner
    push weights version t                 queued on every actor behind what it is doing
    submit batch t + k + 1                 queued behind that push, so sampled by version t
    wait for step t's learner metrics      (the engines keep generating batch t + 1 .. t + k)

so batch t is sampled by version t - k - 1 (0 for the first k + 1 batches) and trained on by
version t - 1: never more than k versions old. The driver holds references and metrics; the
actors do the generation, scoring and training.

With algo.dynamic_sampling, collecting batch t may add rounds of prompts until it holds
prompts_per_step informative groups (dynamic.py); they are sampled by the newest version pushed.
A step that finds none trains on nothing: the version stays and no weights are pushed, so from
then on versions run behind step numbers, and the staleness rule still holds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from grpo_dist.config import Config, dump_config, effective_reward
from grpo_dist.data import PreparedData, PromptCursor, prepare_data
from grpo_dist.dynamic import DynamicSampling
from grpo_dist.eval import evaluate, standard_error
from grpo_dist.learner.group import start_learner
from grpo_dist.metrics import MetricsLog, write_json_atomic
from grpo_dist.pipeline import BY_REFERENCE, Batch, RolloutPipeline, fetch
from grpo_dist.placement import create_placement_group, roles, unplaced
from grpo_dist.report import write_report
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.types import Group, Prompt, SamplingSettings
from grpo_dist.weights import WeightSync, WeightSyncError, make_weight_sync


@dataclass
class Actors:
    rollouts: list[Any]
    rewards: list[Any]
    learner: Any
    placements: dict[str, PlacementGroup]

    @classmethod
    def start(cls, config: Config) -> Actors:
        """Create every actor in a bundle of its role's placement group (placement.py)."""
        seed = config.trainer.seed
        placed = {role.name: (role, create_placement_group(role)) for role in roles(config)}

        def options(name: str, index: int) -> dict:
            role, group = placed[name]
            by_reference = {"runtime_env": BY_REFERENCE} if name in ("rollout", "reward") else {}
            return {**role.actor_options(group, index), **by_reference}

        rollout_cls, reward_cls = ray.remote(RolloutWorker), ray.remote(RewardWorker)
        reward = effective_reward(config)
        actors = cls(
            rollouts=[rollout_cls.options(**options("rollout", index)).remote(config.model, config.rollout,
                                                                               seed * 1000 + index)
                      for index in range(config.rollout.num_workers)],
            rewards=[reward_cls.options(**options("reward", index)).remote(reward)
                     for index in range(config.reward.num_workers)],
            learner=start_learner(config, placement=placed["learner"][1]),  # rank i in bundle i
            placements={name: group for name, (_, group) in placed.items()},
        )
        actors.wait_ready(config.cluster.actor_start_timeout_s)
        return actors

    def wait_ready(self, timeout_s: float) -> None:
        """Block until every actor is constructed; name the resources when some cannot be placed."""
        every = [*self.rollouts, *self.rewards, self.learner]
        ready, pending = ray.wait([a.__ray_ready__.remote() for a in every], num_returns=len(every), timeout=timeout_s)
        ray.get(ready)  # re-raises a constructor's exception
        if pending:
            waiting = unplaced(self.placements)
            self.stop()
            raise TimeoutError(
                f"{len(pending)} of {len(every)} actors not ready after {timeout_s:.0f} s; placement groups not "
                f"placed: {', '.join(waiting) or 'none'}; the cluster has {ray.available_resources()} available "
                f"of {ray.cluster_resources()}: lower the num_cpus/num_gpus/resources of rollout, reward and "
                "learner, drop node_labels no node carries, or add nodes"
            )

    def stop(self) -> None:
        """Let reward actors stop their scoring processes (briefly), then kill every actor."""
        ray.wait([reward.close.remote() for reward in self.rewards], num_returns=len(self.rewards), timeout=10)
        for actor in [*self.rollouts, *self.rewards, self.learner]:
            ray.kill(actor)
        for group in self.placements.values():
            remove_placement_group(group)


class Trainer:
    """Runs GRPO for `config.trainer.steps` steps and writes the run directory."""

    def __init__(self, config: Config, run_dir: Path, data: PreparedData | None = None) -> None:
        """`data`: the prompts launch prepared before Ray started; prepared here when not given."""
        self.config = config
        self.run_dir = run_dir
        data = data if data is not None else prepare_data(config)
        self.train_prompts, self.eval_prompts = data.train, data.eval
        self.cursor = PromptCursor(self.train_prompts, config.trainer.seed)
        self.sampling = sampling_settings(config.rollout)
        trainer = config.trainer
        self.max_staleness = trainer.max_staleness if trainer.mode == "async" else 0
        self.actors: Actors | None = None
        self.sync: WeightSync | None = None
        self.pipeline: RolloutPipeline | None = None
        # collect(batch, version): the pipeline's, or dynamic sampling's rounds on top of it (dynamic.py)
        self.collector: RolloutPipeline | DynamicSampling | None = None
        self.version = 0  # the learner's policy version
        self.in_flight: deque[Batch] = deque()  # submitted batches not yet handed to the learner
        self.submitted = 0  # the last step whose batch was submitted
        self.unverified: deque[tuple[int, list[ray.ObjectRef], ray.ObjectRef]] = deque()
        self.last_groups: list[ray.ObjectRef] = []  # the latest batch, by reference (for sample logs)
        self.step_clock: float | None = None  # when the current step began (the previous one ended)

    def start(self, weight_sync: Callable[[Config, Any, list[Any]], WeightSync] = make_weight_sync) -> None:
        """Start the actors, the weight transport (`trainer.weight_sync`, built by `weight_sync`)
        and the pipeline."""
        self.actors = Actors.start(self.config)
        try:
            self.sync = weight_sync(self.config, self.actors.learner, self.actors.rollouts)
            self.sync.setup()
        except BaseException:
            self.stop()
            raise
        algo = self.config.algo
        self.pipeline = RolloutPipeline(self.actors.rollouts, self.actors.rewards, seed=self.config.trainer.seed,
                                        chunk_prompts=self.config.rollout.chunk_prompts,
                                        max_staleness=self.max_staleness, timeout_s=self.config.trainer.call_timeout_s,
                                        informative_only=algo.dynamic_sampling)
        if algo.dynamic_sampling:
            self.collector = DynamicSampling(self.pipeline, self.cursor.next_batch, self.config.rollout.prompts_per_step,
                                             algo.dynamic_sampling_max_rounds)
        else:
            self.collector = self.pipeline

    def stop(self) -> None:
        if self.sync is not None:
            self.sync.close()
        if self.actors is not None:
            self.actors.stop()

    def run(self) -> dict[str, Any]:
        started = time.time()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(self.config))
        log = MetricsLog(self.run_dir, self.config, started)
        self.start()
        try:
            engines = sorted({d["engine"] for d in self.call([w.describe.remote() for w in self.actors.rollouts],
                                                             "rollout workers: describe")})
            self.verify_weights()
            before = self.evaluate(step=0, log=log)
            steps = self.train(log, started)
            after = self.evaluate(step=steps, log=log)
            if self.config.trainer.save_final:
                self.call([self.actors.learner.save.remote(str(self.run_dir / "final"))], "learner: save")
        finally:
            log.close()
            self.stop()
        write_report(self.run_dir)
        summary = {
            "eval_accuracy_before": before,
            "eval_accuracy_after": after,
            "eval_rows": len(self.eval_prompts),
            "eval_accuracy_stderr_after": standard_error(after, len(self.eval_prompts)) if self.eval_prompts else None,
            "steps": steps,
            "mode": self.config.trainer.mode,
            "max_staleness": self.max_staleness,
            "rollout_engine": ",".join(engines),
            "wall_seconds": round(time.time() - started, 1),
            "run_dir": str(self.run_dir),
        }
        write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def train(self, log: MetricsLog, started: float) -> int:
        trainer = self.config.trainer
        step = 0
        for step in range(1, trainer.steps + 1):
            metrics = self.step(step)
            log.log(step, metrics)
            if metrics.get("rollout/dynamic_groups") == 0:
                log.note(f"step {step}: no informative group in {metrics['rollout/dynamic_rounds']:.0f} rounds "
                         f"(algo.dynamic_sampling_max_rounds): no update, the policy stays version {self.version}")
            if log.wants_samples(step):
                log.log_samples(step, self.sample_groups(trainer.samples_per_log))
            if trainer.eval_every and step % trainer.eval_every == 0 and step < trainer.steps:
                self.evaluate(step, log)
                self.step_clock = time.perf_counter()  # a step's time leaves the evaluation out
            if trainer.max_wall_seconds and time.time() - started > trainer.max_wall_seconds:
                log.note(f"stopping after {step} steps: max_wall_seconds={trainer.max_wall_seconds} reached")
                break
        self.discard_in_flight()
        self.verify_pushed(self.version)
        return step

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step: hand batch `step` to the learner, push the new weights, submit the
        batch `max_staleness + 1` steps ahead; returns the step's metrics."""
        assert self.pipeline is not None and self.actors is not None
        self.step_clock = self.step_clock or time.perf_counter()
        self.fill(step + self.max_staleness)  # (only the first step has anything to fill here)
        batch = self.in_flight.popleft()
        collected = self.collector.collect(batch, self.version)
        self.verify_pushed(max(collected.versions))  # the weights that sampled it had arrived
        depth = self.pipeline.buffer_depth([batch, *self.in_flight], self.config.rollout.prompts_per_step)
        self.last_groups = collected.groups
        result = None  # dynamic sampling may find no informative group: no update, no new version, no push
        if collected.groups:
            result = self.actors.learner.train_step.remote(*collected.groups, max_groups=collected.max_groups)
            self.version += 1
            self.push_weights()
        self.fill(step + self.max_staleness + 1)
        learner_metrics = (self.call([result], f"learner: train_step of step {step}")[0] if result is not None
                           else {"policy/version": float(self.version), "time/learn_s": 0.0})
        now = time.perf_counter()
        step_s, self.step_clock = now - self.step_clock, now
        workers = len(self.actors.rollouts)
        return {
            **collected.metrics,
            **learner_metrics,
            "rollout/buffer_depth": depth,
            "time/step_s": step_s,
            "time/rollout_idle_fraction": max(0.0, 1.0 - collected.generate_busy_s / (workers * step_s)),
            "time/learner_idle_fraction": max(0.0, 1.0 - learner_metrics["time/learn_s"] / step_s),
        }

    def fill(self, last_step: int) -> None:
        """Submit the batches of steps up to `last_step` (and `trainer.steps`) not yet submitted."""
        while self.submitted < min(last_step, self.config.trainer.steps):
            self.submitted += 1
            prompts = self.cursor.next_batch(self.config.rollout.prompts_per_step)
            self.in_flight.append(self.pipeline.submit(self.submitted, prompts, self.sampling))

    def discard_in_flight(self) -> None:
        """Cancel batches submitted for steps that will not run (an early stop)."""
        for batch in self.in_flight:
            for chunk in batch.chunks:
                ray.cancel(chunk.info)
        self.in_flight.clear()

    def rollout(self, prompts: list[Prompt], sampling: SamplingSettings, step: int) -> list[Group]:
        """Generate and score `prompts` now and fetch the groups into the driver (tests, tools)."""
        collected = self.pipeline.collect(self.pipeline.submit(step, prompts, sampling), self.version)
        return [group for chunk in self.call(collected.groups, "reward actors: scored groups") for group in chunk]

    def push_weights(self) -> list[ray.ObjectRef]:
        """Send the learner's weights as `self.version` to every engine, without waiting: each
        takes them after the calls queued before (weights.py: the strategies)."""
        served = self.sync.submit(self.version)
        if self.config.trainer.verify_weight_sync:
            self.unverified.append((self.version, served, self.actors.learner.checksum.remote()))
        return served

    def verify_pushed(self, version: int) -> None:
        """Check the served checksums of every push up to `version`."""
        while self.unverified and self.unverified[0][0] <= version:
            pushed, served, expected = self.unverified.popleft()
            names = [f"rollout worker {index}: load weights version {pushed}" for index in range(len(served))]
            self.compare(self.call(served, names), self.call([expected], "learner: checksum")[0], pushed)

    def broadcast_weights(self) -> None:
        """Push the current version to every worker and wait until each serves it."""
        served = self.push_weights()
        if self.config.trainer.verify_weight_sync:
            self.verify_pushed(self.version)
        else:
            self.call(served, "rollout workers: load weights")

    def verify_weights(self) -> None:
        served = self.call([w.checksum.remote() for w in self.actors.rollouts], "rollout workers: checksum")
        self.compare(served, self.call([self.actors.learner.checksum.remote()], "learner: checksum")[0], self.version)

    @staticmethod
    def compare(served: list[str | None], expected: str, version: int) -> None:
        stale = [index for index, checksum in enumerate(served) if checksum != expected]
        if stale:
            raise WeightSyncError(f"rollout workers {stale} do not serve the learner's weights (version {version})")

    def call(self, refs: list[ray.ObjectRef], names: str | list[str]) -> list[Any]:
        """Wait for actor calls, at most trainer.call_timeout_s (pipeline.fetch)."""
        names = [names] * len(refs) if isinstance(names, str) else names
        return fetch(refs, names, self.config.trainer.call_timeout_s)

    def sample_groups(self, count: int) -> list[Group]:
        """The first `count` groups of the latest batch, fetched into the driver (the samples log)."""
        groups: list[Group] = []
        for ref in self.last_groups:
            if len(groups) >= count:
                break
            groups += self.call([ref], "reward actor: scored groups")[0]
        return groups

    def evaluate(self, step: int, log: MetricsLog) -> float:
        """Greedy accuracy on the held-out rows (eval.evaluate, as `python -m grpo_dist.eval` runs it).

        Its engine calls queue behind the latest weight push, so it measures version `self.version`.
        """
        if not self.eval_prompts:
            return float("nan")
        metrics = evaluate(self.actors.rollouts, self.actors.rewards, self.eval_prompts, self.config)
        log.log_eval(step, metrics)
        return metrics["eval/accuracy"]
