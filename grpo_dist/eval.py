"""Held-out evaluation through the rollout engines: greedy accuracy, pass@k, mean reward.

    python -m grpo_dist.eval --checkpoint PATH [--config FILE ...] [--k 1,4,8] [--temperature T]
                             [--output result.json] [section.field=value ...]

The command line of evaluation.py's `evaluate`, which the trainer's periodic evaluation runs
too: it starts the rollout and reward actors on the policy through the placement code training
uses (controller/actors.py), joining a running cluster or starting a local one as launch does
(cluster.py). PATH is a model folder (RUN_DIR/final, a checkpoint's policy/), a run directory
(its config.yaml and final/) or a checkpoint (its config.yaml and policy/).

Exit codes: 0 done, 2 bad arguments or configuration (nothing was started), 1 a failed run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from grpo_dist.controller.cluster import choose_cluster, connect_ray, shutdown_ray
from grpo_dist.config.schema import Config, ConfigError, load_config
from grpo_dist.controller.errors import FAILURES, StartError
from grpo_dist.tasks.data import DataError, held_out_prompts
from grpo_dist.common.atomic import write_json_atomic
from grpo_dist.common.model_files import check_model_folder
from grpo_dist.common.process_exit import end_process


def resolve_checkpoint(path: str, config_files: list[str], overrides: list[str]) -> tuple[Path, Config]:
    """The model folder to evaluate and the config to evaluate it with.

    A folder with a config.yaml is a run directory (its policy: final/) or one of its
    checkpoints (checkpoints/step_N, its policy: policy/); its config.yaml is the base the
    `config_files` are laid over, as for a resumed run. A model folder (config.json) is
    evaluated under `config_files` or the built-in default. The overrides apply last, then
    model.path becomes the model folder, whose files are checked (model_files.py).
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
    check_model_folder(config.model.path, config.data.chat_template)
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
        connect_ray(config, choose_cluster(config.cluster.address))
    except (ConfigError, DataError, StartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from grpo_dist.controller.actors import Actors
    from grpo_dist.observe.evaluation import evaluate
    from grpo_dist.common.waits import fetch

    try:
        actors = Actors.start(config, learner=False)
        metrics = evaluate(actors.rollouts, actors.rewards, prompts, config, ks, args.temperature)
        [described] = fetch([actors.rollouts[0].describe.remote()], ["rollout worker 0: describe"],
                            config.trainer.call_timeout_s)
    except FAILURES as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutdown_ray()
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
    end_process(main())
