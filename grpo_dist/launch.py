"""Command line: `python -m grpo_dist.launch [--config FILE] [--resume RUN_DIR|auto] [section.field=value ...]`.

With no arguments it trains the built-in default (configs/default.yaml) on the CPU.
Exit codes: 0 done; 1 a failed run (one message: what failed, the last checkpoint and the
command that resumes from it); 2 the run could not start: an invalid config or dataset, a run
directory that holds another run, a checkpoint that is incomplete, was made with a config that
differs in a field that decides what is trained, or with other training data, a Ray address
that does not answer. Code 2 comes with one message, before any actor starts and before
anything is written. 128 + N: stopped by signal N (SIGINT 130, SIGTERM 143): the first one
lets the step in progress finish and saves a checkpoint, a second stops at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_dist.checkpoint import (Checkpoint, CheckpointError, check_resume_config, find_run, resume_checkpoint,
                                  resume_hint)
from grpo_dist.config import Config, ConfigError, dump_config, load_config
from grpo_dist.data import DataError, prepare_data

PROBE_TIMEOUT_S = 2.0


class StartError(RuntimeError):
    """The run cannot start; the message says why (exit code 2)."""


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
    """Resolve config, run directory and checkpoint; raise ConfigError or CheckpointError.

    A resumed run starts from the checkpoint's config, with --config and the overrides laid over it.
    """
    overrides = list(args.overrides) + ([f"cluster.address={args.address}"] if args.address else [])
    config = load_config(args.config, overrides)
    if args.resume is None:
        return RunPlan(config, run_dir_for(config), None)
    run_dir = find_run(Path(config.trainer.output_dir)) if args.resume == "auto" else Path(args.resume)
    checkpoint = resume_checkpoint(run_dir)
    config = load_config(args.config, overrides, base=checkpoint.config)
    check_resume_config(checkpoint.config, config)
    return RunPlan(config, run_dir, checkpoint)


def check_new_run_dir(run_dir: Path) -> None:
    """A new run never writes into a directory that holds files (another run's, most likely)."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise StartError(
            f"run directory {run_dir} already holds a run: continue it with --resume {run_dir}, "
            "or set another trainer.run_name or trainer.output_dir"
        )


def ray_address_file() -> Path:
    """Where `ray start` records the running cluster's address (Ray's rule, read without importing ray)."""
    root = os.environ.get("RAY_TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    return Path(root) / "ray" / "ray_current_cluster"


def probe_ray(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a Ray cluster answers at `host:port` (its GCS) or `ray://host:port` (its client
    server) within the timeout; otherwise what went wrong, in words.

    A TCP connect is not enough: a proxy or another server may hold the port, and ray.init
    then retries for minutes. This asks one gRPC question of the service Ray runs there; an
    answer "authentication token missing" is Ray's too (token auth is on by default).
    """
    import grpc  # with ray[default]; importing it does not import ray

    client = address.startswith("ray://")
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise StartError(f"Ray address {address!r} is not host:port or ray://host:port")
    method = "/ray.rpc.RayletDriver/ClusterInfo" if client else "/ray.rpc.NodeInfoGcsService/GetClusterId"
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
        try:
            call(b"", timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return None
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return f"nothing answers there within {timeout_s:.0f} s"
            return f"what answers there is not a Ray {'client server' if client else 'GCS'} ({exc.code().name})"
    return None


def running_cluster() -> tuple[str, str] | None:
    """The address of "the running cluster" and where it was found: RAY_ADDRESS, else `ray start`'s file."""
    if os.environ.get("RAY_ADDRESS", "auto") != "auto":
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    file = ray_address_file()
    recorded = file.read_text().strip() if file.is_file() else ""
    return (recorded, str(file)) if recorded else None


def choose_cluster(address: str | None) -> str | None:
    """The address to join, or None to start a local cluster; StartError when a required one is down.

    null: the running cluster if it answers within PROBE_TIMEOUT_S, else a local one (one line
    says so); 'local': a local one; 'auto': the running cluster, which must answer; else that
    address, which must answer. RAY_ADDRESS counts as given explicitly. Unlike
    ray.init(address="auto"), a cluster that another driver started for itself is never joined.
    """
    if address == "local":
        return None
    if address not in (None, "auto"):
        return require_ray(address, "cluster.address")
    found = running_cluster()
    if found is None and address == "auto":
        raise StartError(f"cluster.address=auto: no running Ray cluster (RAY_ADDRESS is unset and "
                         f"{ray_address_file()} does not exist); start one with `ray start --head`")
    if found is None or found[0] == "local":
        return None
    recorded, source = found
    if address == "auto" or source == "RAY_ADDRESS":
        return require_ray(recorded, source)
    problem = probe_ray(recorded)
    if problem is not None:
        print(f"the Ray cluster recorded in {source} ({recorded}) is gone: {problem}; starting a local cluster",
              file=sys.stderr)
        return None
    return recorded


def require_ray(address: str, source: str) -> str:
    problem = probe_ray(address)
    if problem is not None:
        raise StartError(f"Ray address {address} (from {source}): {problem}; start that cluster, or set "
                         "cluster.address=local")
    return address


def connect_ray(config: Config) -> None:
    """Join the chosen cluster, or start a local one that listens on 127.0.0.1 only, with the
    dashboard when its packages are installed (its URL is printed).

    Ray takes the interface address as the node IP on Linux, also for `_node_ip_address=
    "127.0.0.1"`; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes it use the loopback address, as it
    does on a laptop. Ray reads it when it is imported, so it is set before `import ray`.
    Ray's token authentication stays as Ray sets it.
    """
    join = choose_cluster(config.cluster.address)
    if join is None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    import ray

    common = {"namespace": config.cluster.namespace, "log_to_driver": True}
    if join is None:  # the dashboard (and the Jobs API) starts where ray[default] is installed
        context = ray.init(address="local", num_cpus=config.cluster.num_cpus, dashboard_host="127.0.0.1", **common)
        if context.dashboard_url:
            print(f"Ray dashboard: http://{context.dashboard_url}", file=sys.stderr)
    else:
        ray.init(address=join, **common)
        print(f"joined the Ray cluster at {join}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = plan_run(args)
        if args.print_config:
            print(dump_config(plan.config), end="")
            return 0
        if plan.checkpoint is None:
            check_new_run_dir(plan.run_dir)
        data = prepare_data(plan.config)  # bad data exits here, before Ray starts
        if plan.checkpoint is not None:  # so does a cursor over other data
            plan.checkpoint.restore_data(data.train, plan.config.trainer.seed)
        connect_ray(plan.config)
    except (ConfigError, CheckpointError, DataError, StartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import ray

    from grpo_dist.trainer import FAILURES, Trainer

    trainer = Trainer(plan.config, plan.run_dir, data=data, resume=plan.checkpoint)
    try:
        summary = trainer.run()
    except FAILURES as exc:
        print(f"error: {exc}; {resume_hint(plan.run_dir)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # a second SIGINT/SIGTERM (or Ctrl-C before the handlers)
        print(f"stopped: {exc or 'interrupted'}; {resume_hint(plan.run_dir)}", file=sys.stderr)
        return 128 + (trainer.stop_signal or signal.SIGINT)
    finally:
        ray.shutdown()
    print(json.dumps(summary, indent=2))
    if trainer.stop_signal is not None:
        print(f"stopped by {summary['stopped_by']} after step {summary['steps']}; {resume_hint(plan.run_dir)}",
              file=sys.stderr)
        return 128 + trainer.stop_signal
    return 0


if __name__ == "__main__":
    sys.exit(main())
