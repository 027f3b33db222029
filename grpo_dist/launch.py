"""Command line: `python -m grpo_dist.launch [--config FILE] [section.field=value ...]`.

With no arguments it trains the built-in default (configs/default.yaml) on the CPU.
Exit codes: 0 done, 2 invalid configuration or data (nothing was started), 1 a failed run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from grpo_dist.config import Config, ConfigError, dump_config, load_config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m grpo_dist.launch", description="GRPO training on Ray.")
    parser.add_argument("--config", help="YAML recipe (default: the built-in default task)")
    parser.add_argument("--address", help="Ray address to join (default: a running cluster, else a new local one)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="section.field=value", help="e.g. algo.beta=0.04")
    return parser.parse_args(argv)


def connect_ray(config: Config) -> None:
    """Join the configured or running cluster; start a local one when there is none."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    common = {"namespace": config.cluster.namespace, "log_to_driver": True}
    address = config.cluster.address
    if address not in (None, "local"):
        ray.init(address=address, **common)
        return
    if address is None:
        try:
            ray.init(address="auto", **common)
            print("joined the running Ray cluster", file=sys.stderr)
            return
        except ConnectionError:
            pass
    ray.init(address="local", num_cpus=config.cluster.num_cpus, include_dashboard=False, **common)


def run_dir_for(config: Config) -> Path:
    name = config.trainer.run_name or time.strftime("%Y%m%d-%H%M%S")
    return Path(config.trainer.output_dir) / name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = list(args.overrides) + ([f"cluster.address={args.address}"] if args.address else [])
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(config), end="")
        return 0

    from grpo_dist.data import DataError, prepare_data

    try:
        data = prepare_data(config)  # bad data exits here, before Ray starts
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import ray

    from grpo_dist.trainer import Trainer

    connect_ray(config)
    try:
        summary = Trainer(config, run_dir_for(config), data=data).run()
    finally:
        ray.shutdown()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
