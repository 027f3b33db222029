"""Held-out evaluation through the rollout engines: greedy accuracy, pass@k, mean reward.

    python -m grpo_dist.eval --checkpoint PATH [--config FILE ...] [--k 1,4,8] [--temperature T]
                             [--output result.json] [section.field=value ...]

`evaluate` is the one code path: the trainer's periodic evaluation calls it with the run's
actors; the command starts RolloutWorker and RewardWorker actors on the policy (joining a
running cluster or starting a local one, as launch does) and calls it too. PATH is a model folder (RUN_DIR/final, a checkpoint's policy/),
a run directory (its config.yaml and final/) or a checkpoint (its config.yaml and policy/).

Exit codes: 0 done, 2 bad arguments or configuration (nothing was started), 1 a failed run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpo_dist.config import Config, ConfigError, effective_reward, load_config
from grpo_dist.data import DataError, held_out_prompts
from grpo_dist.metrics import write_json_atomic
from grpo_dist.seeding import prompt_seed
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.types import Group, Prompt, SamplingSettings

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


def is_correct(value: float) -> bool:
    """A completion counts as correct when the `reward.accuracy_from` function gave it 1."""
    return value >= 1.0


def generate(rollouts: list[Any], prompts: list[Prompt], sampling: SamplingSettings, seed: int,
             timeout_s: float) -> list[Group]:
    """One group per prompt, the prompts split over the rollout workers in contiguous chunks;
    waiting longer than `timeout_s` raises pipeline.CallTimeout."""
    from grpo_dist.pipeline import fetch  # imports ray

    seeds = [prompt_seed(seed, EVAL_STEP, prompt.index) for prompt in prompts]
    size = math.ceil(len(prompts) / len(rollouts))
    futures = [worker.generate.remote(prompts[i : i + size], sampling, seeds[i : i + size])
               for worker, i in zip(rollouts, range(0, len(prompts), size))]
    names = [f"rollout worker {index}: generate (evaluation)" for index in range(len(futures))]
    return [group for chunk in fetch(futures, names, timeout_s) for group in chunk]


def score(rewards: list[Any], groups: list[Group], timeout_s: float) -> list[Group]:
    """The groups with their rewards filled in by the reward workers (split like `generate`)."""
    from grpo_dist.pipeline import fetch  # imports ray

    size = math.ceil(len(groups) / len(rewards))
    futures = [worker.score.remote(groups[i : i + size]) for worker, i in zip(rewards, range(0, len(groups), size))]
    names = [f"reward actor {index}: score (evaluation)" for index in range(len(futures))]
    return [group for scored, _ in fetch(futures, names, timeout_s) for group in scored]


def evaluate(rollouts: list[Any], rewards: list[Any], prompts: list[Prompt], config: Config,
             ks: tuple[int, ...] = (), temperature: float | None = None) -> dict[str, float]:
    """Score `prompts` with the configured rewards through the rollout workers' engines.

    Greedy decoding gives `eval/accuracy` (with its standard error) and `eval/mean_reward`;
    with `ks`, n = max(ks) samples per row at `temperature` (default: rollout.temperature)
    give `eval/pass@k` for each k, averaged over the rows.
    """
    clock = time.perf_counter()
    accuracy_from, seed = config.reward.accuracy_from, config.trainer.seed
    greedy = sampling_settings(config.rollout, greedy=True)
    timeout_s = config.trainer.call_timeout_s
    groups = score(rewards, generate(rollouts, prompts, greedy, seed, timeout_s), timeout_s)
    accuracy = sum(is_correct(g.reward_parts[accuracy_from][0]) for g in groups) / len(groups)
    metrics = {
        "eval/accuracy": accuracy,
        "eval/accuracy_stderr": standard_error(accuracy, len(groups)),
        "eval/rows": len(groups),
        "eval/mean_reward": sum(g.rewards[0] for g in groups) / len(groups),
    }
    if ks:
        n = max(ks)
        sampling = replace(sampling_settings(config.rollout), n=n,
                           temperature=config.rollout.temperature if temperature is None else temperature)
        correct = [sum(map(is_correct, g.reward_parts[accuracy_from]))
                   for g in score(rewards, generate(rollouts, prompts, sampling, seed, timeout_s), timeout_s)]
        for k in sorted(ks):
            metrics[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
    metrics["time/eval_s"] = time.perf_counter() - clock
    return metrics


def resolve_checkpoint(path: str, config_files: list[str], overrides: list[str]) -> tuple[Path, Config]:
    """The model folder to evaluate and the config to evaluate it with.

    A folder with a config.yaml is a run directory (its policy: final/) or one of its
    checkpoints (checkpoints/step_N, its policy: policy/); its config.yaml is the base the
    `config_files` are laid over, as for a resumed run. A model folder (config.json) is
    evaluated under `config_files` or the built-in default. The overrides apply last, then
    model.path becomes the model folder.
    """
    folder = Path(path)
    if (folder / "config.yaml").is_file():
        config_files = [str(folder / "config.yaml"), *config_files]
        model_dir = next((folder / name for name in ("final", "policy") if (folder / name / "config.json").is_file()),
                         None)
        if model_dir is None:
            raise ConfigError(f"--checkpoint {path}: no policy in {folder / 'final'} (or policy/ of a checkpoint): "
                              f"name a checkpoint, e.g. {folder / 'checkpoints' / 'step_000050'}")
    elif (folder / "config.json").is_file():
        model_dir = folder
    else:
        raise ConfigError(f"--checkpoint {path}: neither a model folder (config.json) "
                          "nor a run directory or checkpoint (config.yaml)")
    config = load_config(config_files, overrides)
    try:
        config.model.path = str(model_dir.resolve())
    except ValidationError as exc:
        raise ConfigError(f"--checkpoint {path}: {exc.errors()[0]['msg']}") from None
    if not config.data.eval:
        raise ConfigError("data.eval = None: no held-out split to evaluate")
    return model_dir, config


def parse_ks(text: str | None) -> tuple[int, ...]:
    """`--k 1,4,8` -> (1, 4, 8); each k >= 1."""
    if not text:
        return ()
    try:
        ks = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise ConfigError(f"--k {text!r}: expected comma-separated whole numbers such as 1,4,8") from None
    if ks[0] < 1:
        raise ConfigError(f"--k {text!r}: every k must be >= 1")
    return ks


def start_actors(config: Config) -> tuple[list[Any], list[Any]]:
    """Rollout and reward workers as the config asks (no placement group: evaluation only)."""
    import ray

    from grpo_dist.reward.worker import RewardWorker
    from grpo_dist.rollout.worker import RolloutWorker

    rollout, reward = config.rollout, config.reward
    rollouts = [ray.remote(RolloutWorker).options(num_cpus=rollout.num_cpus, num_gpus=rollout.num_gpus)
                .remote(config.model, rollout, config.trainer.seed * 1000 + index)
                for index in range(rollout.num_workers)]
    rewards = [ray.remote(RewardWorker).options(num_cpus=reward.num_cpus, num_gpus=reward.num_gpus)
               .remote(effective_reward(config)) for _ in range(reward.num_workers)]
    from grpo_dist.pipeline import fetch

    names = [f"rollout worker {i}: start" for i in range(len(rollouts))]
    names += [f"reward actor {i}: start" for i in range(len(rewards))]
    fetch([actor.__ray_ready__.remote() for actor in [*rollouts, *rewards]], names,
          config.cluster.actor_start_timeout_s)
    return rollouts, rewards


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m grpo_dist.eval",
                                     description="Evaluate a policy on the held-out split.")
    parser.add_argument("--checkpoint", required=True, help="model folder (RUN_DIR/final) or run directory")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML recipe; several compose in order, over the run's config.yaml if PATH has one")
    parser.add_argument("--k", help="pass@k for these k, e.g. 1,4,8 (n = max k samples per prompt)")
    parser.add_argument("--temperature", type=float, help="pass@k sampling temperature (default: rollout.temperature)")
    parser.add_argument("--output", help="where to write the JSON result (default: print it only)")
    parser.add_argument("overrides", nargs="*", metavar="section.field=value", help="e.g. data.eval_rows=100")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        model_dir, config = resolve_checkpoint(args.checkpoint, args.config, args.overrides)
        ks = parse_ks(args.k)
        if args.temperature is not None and (not ks or args.temperature <= 0):
            raise ConfigError(f"--temperature {args.temperature}: it sets pass@k's sampling: give --k, and a value > 0")
        prompts = held_out_prompts(config)  # bad data exits here, before Ray starts
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from grpo_dist.launch import connect_ray

    connect_ray(config)  # before anything imports ray: it sets how a local cluster starts
    import ray

    from grpo_dist.pipeline import fetch

    try:
        rollouts, rewards = start_actors(config)
        metrics = evaluate(rollouts, rewards, prompts, config, ks, args.temperature)
        [described] = fetch([rollouts[0].describe.remote()], ["rollout worker 0: describe"],
                            config.trainer.call_timeout_s)
    finally:
        ray.shutdown()
    result = {
        "checkpoint": str(model_dir),
        "data": config.data.eval,
        "engine": described["engine"],
        "samples_per_prompt": max(ks) if ks else 0,
        "temperature": (args.temperature or config.rollout.temperature) if ks else None,
        "metrics": metrics,
    }
    if args.output:
        write_json_atomic(Path(args.output), result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
