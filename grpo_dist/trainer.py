"""The controller: the synchronous GRPO loop, run in the driver process.

    prompts -> RolloutWorker x N -> RewardWorker x M -> Learner -> weights -> RolloutWorker x N

It owns the loop and nothing heavy: actors do the generation, scoring and training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from grpo_dist.config import Config, dump_config, effective_reward
from grpo_dist.data import PreparedData, PromptCursor, prepare_data
from grpo_dist.eval import evaluate, standard_error
from grpo_dist.learner.group import start_learner
from grpo_dist.metrics import MetricsLog, engine_memory, write_json_atomic
from grpo_dist.placement import in_bundle, rollout_placement_group
from grpo_dist.report import write_report
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.seeding import prompt_seed
from grpo_dist.types import Group, Prompt, SamplingSettings
from grpo_dist.weights import WeightSync, WeightSyncError, make_weight_sync

T = TypeVar("T")


def split(items: list[T], parts: int) -> list[list[T]]:
    """Contiguous, nearly equal chunks (some may be empty when items < parts)."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        chunks.append(items[start:end])
        start = end
    return chunks


@dataclass
class Actors:
    rollouts: list[Any]
    rewards: list[Any]
    learner: Any
    placement: PlacementGroup

    @classmethod
    def start(cls, config: Config) -> Actors:
        """Create every actor with the resources its config section asks for.

        Rollout workers go into one placement group, a bundle each (rollout.placement).
        """
        seed = config.trainer.seed
        placement = rollout_placement_group(config.rollout)
        rollout_cls = ray.remote(RolloutWorker)
        reward_cls = ray.remote(RewardWorker).options(num_cpus=config.reward.num_cpus, num_gpus=config.reward.num_gpus)
        actors = cls(
            rollouts=[
                rollout_cls.options(
                    num_cpus=config.rollout.num_cpus,
                    num_gpus=config.rollout.num_gpus,
                    scheduling_strategy=in_bundle(placement, index),
                ).remote(config.model, config.rollout, seed * 1000 + index)
                for index in range(config.rollout.num_workers)
            ],
            rewards=[reward_cls.remote(effective_reward(config)) for _ in range(config.reward.num_workers)],
            learner=start_learner(config),
            placement=placement,
        )
        actors.wait_ready(config.cluster.actor_start_timeout_s)
        return actors

    def wait_ready(self, timeout_s: float) -> None:
        """Block until every actor is constructed; name the resources when some cannot be placed."""
        every = [*self.rollouts, *self.rewards, self.learner]
        ready, pending = ray.wait([a.__ray_ready__.remote() for a in every], num_returns=len(every), timeout=timeout_s)
        ray.get(ready)  # re-raises a constructor's exception
        if pending:
            self.stop()
            raise TimeoutError(
                f"{len(pending)} of {len(every)} actors not ready after {timeout_s:.0f} s; the cluster has "
                f"{ray.available_resources()} available of {ray.cluster_resources()}: lower the num_cpus/num_gpus "
                "of rollout, reward and learner, or add nodes"
            )

    def stop(self) -> None:
        """Let reward actors stop their scoring processes (briefly), then kill every actor."""
        ray.wait([reward.close.remote() for reward in self.rewards], num_returns=len(self.rewards), timeout=10)
        for actor in [*self.rollouts, *self.rewards, self.learner]:
            ray.kill(actor)
        remove_placement_group(self.placement)


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
        self.actors: Actors | None = None
        self.sync: WeightSync | None = None
        self.version = 0

    def start(self) -> None:
        """Start the actors and the weight transport (`trainer.weight_sync`)."""
        self.actors = Actors.start(self.config)
        try:
            self.sync = make_weight_sync(self.config, self.actors.learner, self.actors.rollouts)
            self.sync.setup()
        except BaseException:
            self.stop()
            raise

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
            engines = sorted({d["engine"] for d in ray.get([w.describe.remote() for w in self.actors.rollouts])})
            self.verify_weights()
            before = self.evaluate(step=0, log=log)
            steps = self.train(log, started)
            after = self.evaluate(step=steps, log=log)
            if self.config.trainer.save_final:
                ray.get(self.actors.learner.save.remote(str(self.run_dir / "final")))
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
            log.log(step, self.step(step))
            if log.wants_samples(step):
                log.log_samples(step, self.last_groups)
            if trainer.eval_every and step % trainer.eval_every == 0 and step < trainer.steps:
                self.evaluate(step, log)
            if trainer.max_wall_seconds and time.time() - started > trainer.max_wall_seconds:
                log.note(f"stopping after {step} steps: max_wall_seconds={trainer.max_wall_seconds} reached")
                break
        return step

    def step(self, step: int) -> dict[str, float]:
        """One synchronous GRPO step; returns its metrics."""
        assert self.actors is not None
        timings: dict[str, float] = {}
        clock = time.perf_counter()
        prompts = self.cursor.next_batch(self.config.rollout.prompts_per_step)
        groups = self.generate(prompts, self.sampling, step)
        timings["time/generate_s"] = time.perf_counter() - clock

        clock = time.perf_counter()
        groups, reward_stats = self.score(groups)
        timings["time/reward_s"] = time.perf_counter() - clock
        self.last_groups = groups  # for the samples log

        clock = time.perf_counter()
        learner_metrics = ray.get(self.actors.learner.train_step.remote(groups))
        timings["time/learn_s"] = time.perf_counter() - clock

        clock = time.perf_counter()
        self.version += 1
        self.broadcast_weights()
        timings["time/sync_s"] = time.perf_counter() - clock
        timings["time/step_s"] = sum(timings.values())
        metrics = {**self.rollout_metrics(groups, timings["time/generate_s"]), **reward_stats, **learner_metrics}
        return {**metrics, **timings, **engine_memory(self.actors.rollouts)}

    def generate(self, prompts: list[Prompt], sampling: SamplingSettings, step: int) -> list[Group]:
        """Split `prompts` over the rollout workers; prompt i of step `step` samples with its own seed."""
        seeds = [prompt_seed(self.config.trainer.seed, step, position) for position in range(len(prompts))]
        workers = self.actors.rollouts
        chunks = zip(workers, split(prompts, len(workers)), split(seeds, len(workers)))
        futures = [worker.generate.remote(p, sampling, s) for worker, p, s in chunks if p]
        return [group for chunk in ray.get(futures) for group in chunk]

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        chunks = [c for c in split(groups, len(self.actors.rewards)) if c]
        results = ray.get([worker.score.remote(c) for worker, c in zip(self.actors.rewards, chunks)])
        scored = [group for chunk, _ in results for group in chunk]
        stats: dict[str, float] = {}
        for _, chunk_stats in results:
            for key, value in chunk_stats.items():
                stats[key] = stats.get(key, 0.0) + value
        return scored, stats

    def broadcast_weights(self) -> None:
        """Send the learner's weights to every rollout worker (weights/: the strategies)."""
        served = self.sync.push(self.version)
        if self.config.trainer.verify_weight_sync:
            self.check_checksums(served)

    def verify_weights(self) -> None:
        self.check_checksums(ray.get([w.checksum.remote() for w in self.actors.rollouts]))

    def check_checksums(self, served: list[str | None]) -> None:
        expected = ray.get(self.actors.learner.checksum.remote())
        stale = [index for index, checksum in enumerate(served) if checksum != expected]
        if stale:
            raise WeightSyncError(f"rollout workers {stale} do not serve the learner's weights (version {self.version})")

    def rollout_metrics(self, groups: list[Group], generate_s: float) -> dict[str, float]:
        completions = [c for g in groups for c in g.completions]
        rewards = [r for g in groups for r in g.rewards]
        accuracy_values = [v for g in groups for v in g.reward_parts[self.config.reward.accuracy_from]]
        tokens = sum(len(c.token_ids) for c in completions)
        mean = sum(rewards) / len(rewards)
        metrics = {
            "reward/mean": mean,
            "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
            "reward/accuracy": sum(v >= 1.0 for v in accuracy_values) / len(accuracy_values),
            "rollout/completion_length": tokens / len(completions),
            "rollout/truncated_fraction": sum(c.finish_reason == "length" for c in completions) / len(completions),
            "system/generate_tokens_per_s": tokens / max(generate_s, 1e-9),
        }
        for name in groups[0].reward_parts:
            values = [v for g in groups for v in g.reward_parts[name]]
            metrics[f"reward/{name}/mean"] = sum(values) / len(values)
        return metrics

    def evaluate(self, step: int, log: MetricsLog) -> float:
        """Greedy accuracy on the held-out rows (eval.evaluate, as `python -m grpo_dist.eval` runs it)."""
        if not self.eval_prompts:
            return float("nan")
        metrics = evaluate(self.actors.rollouts, self.actors.rewards, self.eval_prompts, self.config)
        log.log_eval(step, metrics)
        return metrics["eval/accuracy"]
