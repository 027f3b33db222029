"""Command line: `python -m grpo_dist.launch [--config FILE] [--resume RUN_DIR|auto] [section.field=value ...]`.

With no arguments it trains the built-in default (configs/default.yaml) on the CPU.
Exit codes: 0 done; 1 a failed run (one message: what failed, the last checkpoint and the
command that resumes from it); 2 the run could not start: an invalid config or dataset, a run
directory that holds another run, a checkpoint that is incomplete, damaged (a file's bytes
changed), of another run, made with a config that differs in a field that decides what is
trained, or with other training data, a Ray address that does not answer, a cluster too
small for the run's actors. Code 2 comes with one message, before anything is written; actors
started meanwhile (they start while the data are read) are stopped with Ray. 128 + N: stopped
by signal N (SIGINT 130, SIGTERM 143): the first one lets the step in progress finish and saves
a checkpoint, a second stops at once.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grpo_dist.controller.cluster import choose_cluster, connect_ray, ray_environment, shutdown_ray
from grpo_dist.config.schema import Config, ConfigError, compose_tree, dump_config, load_config
from grpo_dist.controller.actors import Actors  # no torch: the actors' classes are controller/actor_classes.py
from grpo_dist.controller.manifest import CheckpointError
from grpo_dist.controller.resume import (Checkpoint, check_resume_config, find_checkpoint, resume_checkpoint,
                                         resume_hint)
from grpo_dist.controller.errors import FAILURES, StartError
from grpo_dist.tasks.data import DataError, prepare_data
from grpo_dist.common.model_files import check_model_folder
from grpo_dist.common.process_exit import end_process
from grpo_dist.observe.timeline import Timeline


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m grpo_dist.launch", description="GRPO training on Ray.")
    parser.add_argument("--config", action="append", metavar="FILE",
                        help="YAML recipe (default: the built-in default task); give several to compose them, "
                        "later files overriding earlier ones, e.g. a task and configs/algos/dapo.yaml")
    parser.add_argument("--address", help="Ray address to join (default: a running cluster, else a new local one)")
    parser.add_argument("--resume", metavar="RUN_DIR|auto",
                        help="continue a run from its newest checkpoint; auto: the newest run in trainer.output_dir")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="section.field=value", help="e.g. algo.beta=0.04")
    return parser.parse_args(argv)


@dataclass
class RunPlan:
    """What a launch will run: the resolved config, its run directory, the checkpoint it resumes."""

    config: Config
    run_dir: Path
    checkpoint: Checkpoint | None


def run_dir_for(config: Config) -> Path:
    name = config.trainer.run_name or time.strftime("%Y%m%d-%H%M%S")
    return Path(config.trainer.output_dir) / name


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Resolve config, run directory and checkpoint, and check the model folder's files; raise
    ConfigError or CheckpointError.

    A resumed run starts from the checkpoint's config, with --config and the overrides laid over it
    (and validated there only: `learner.offload=all` is valid over an fsdp run's config).
    """
    overrides = list(args.overrides) + ([f"cluster.address={args.address}"] if args.address else [])
    if args.resume is None:
        config = load_config(args.config, overrides)
        check_model_folder(config.model.path, config.data.chat_template)
        return RunPlan(config, run_dir_for(config), None)
    if args.resume == "auto":  # the newest checkpoint that loads; each newer one skipped is told in a line
        output_dir = Path(compose_tree(args.config, overrides)["trainer"]["output_dir"])
        checkpoint = find_checkpoint(output_dir, lambda line: print(f"warning: {line}", file=sys.stderr))
        run_dir = checkpoint.path.parent.parent
    else:
        run_dir = Path(args.resume)
        checkpoint = resume_checkpoint(run_dir)
    config = load_config(args.config, overrides, base=checkpoint.config)
    check_resume_config(checkpoint.config, config)
    check_model_folder(config.model.path, config.data.chat_template)
    return RunPlan(config, run_dir, checkpoint)


def check_new_run_dir(run_dir: Path) -> None:
    """A new run never writes into a directory that holds files (another run's, most likely)."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise StartError(
            f"run directory {run_dir} already holds a run: continue it with --resume {run_dir}, "
            "or set another trainer.run_name or trainer.output_dir"
        )


def import_trainer() -> type:
    """The TrainingRun class: its imports (torch, transformers, the controller's modules) take seconds."""
    from grpo_dist.controller.run import TrainingRun

    return TrainingRun


def connect_or_error(config: Config, join: str | None) -> StartError | None:
    """connect_ray, its StartError returned: a data error, found meanwhile, is told first."""
    try:
        connect_ray(config, join)
    except StartError as exc:
        return exc
    return None


def main(argv: list[str] | None = None) -> int:
    timeline = Timeline()  # from the process start: the interpreter and these imports count
    timeline.add("interpreter_and_imports", timeline.since_start())
    args = parse_args(argv)
    try:
        with timeline.phase("config"):
            plan = plan_run(args)
        if args.print_config:
            print(dump_config(plan.config), end="")
            return 0
        if plan.checkpoint is None:
            check_new_run_dir(plan.run_dir)
        with timeline.phase("find_cluster"):
            join = choose_cluster(plan.config.cluster.address)  # a dead address exits here, in seconds
        ray_environment(join)  # before the data's imports may import ray
        with ThreadPoolExecutor(1, thread_name_prefix="data") as pool:
            # While Ray starts, one thread imports the trainer, then reads the data (the tokenizer,
            # tokenizing); the actors are created as soon as Ray is up and start (their own imports,
            # model loads) while the trainer is still imported and the data read. Bad data is exit 2
            # all the same: Ray is stopped, and the actors with it.
            imported = pool.submit(import_trainer)
            data_read = pool.submit(prepare_data, plan.config)  # after the imports: one thread imports
            with timeline.phase("ray_start_beside_data"):
                connected = connect_or_error(plan.config, join)
            actors = None
            if connected is None:
                with timeline.phase("actors_created"):
                    actors = Actors.create(plan.config)
            with timeline.phase("trainer_imports_after_actors_created"):
                TrainingRun = imported.result()
            with timeline.phase("data_after_trainer_imports"):
                data = data_read.result()
            if isinstance(connected, StartError):
                raise connected
        # a resume restores its data cursor here, once: a cursor over other data exits here too
        trainer = TrainingRun(plan.config, plan.run_dir, data=data, resume=plan.checkpoint, timeline=timeline,
                              actors=actors)
    except (ConfigError, CheckpointError, DataError, StartError) as exc:
        shutdown_ray()  # a start error after Ray started: the actors stop with it
        print(f"error: {exc}", file=sys.stderr)
        return 2

    try:
        summary = trainer.run(wait_report=False)  # drawn while Ray shuts down (finish_summary waits)
        with timeline.phase("ray_shutdown"):
            shutdown_ray()
        summary = trainer.finish_summary(summary)  # report.png and summary.json: a full disk fails here too
    except FAILURES as exc:
        print(f"error: {exc}; {resume_hint(plan.run_dir)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # a second SIGINT/SIGTERM (or Ctrl-C before the handlers)
        print(f"stopped: {exc or 'interrupted'}; {resume_hint(plan.run_dir)}", file=sys.stderr)
        return 128 + (trainer.stop_signal or signal.SIGINT)
    finally:
        shutdown_ray()  # (again after a failure; a second call does nothing)
    return summary_exit(summary, trainer.stop_signal, plan.run_dir)


def summary_exit(summary: dict, stop_signal: int | None, run_dir: Path) -> int:
    """Print the run's summary; the exit code: 0, or 128 + the signal that stopped the run."""
    print(json.dumps(summary, indent=2))
    if stop_signal is not None:
        print(f"stopped by {summary['stopped_by']} after step {summary['steps']}; {resume_hint(run_dir)}",
              file=sys.stderr)
        return 128 + stop_signal
    return 0


if __name__ == "__main__":
    end_process(main())
