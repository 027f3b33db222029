"""Seconds from creating three empty actors to all of them ready, on a fresh local Ray cluster,
without and with a runtime environment of their own, alternating, in one invocation.

    .venv/bin/python benchmarks/actor_start.py [--repeats 3]

A local cluster starts idle worker processes ahead; an actor with the default runtime
environment can take one, an actor with an environment of its own (here the one a joined
cluster's rollout and reward actors get, actors.BY_REFERENCE) needs a new process. Each
measurement is a new interpreter starting its own cluster, waiting 3 s for the workers started
ahead, then creating the actors (docs/speed.md, "The start, 2026-12-07").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_dist.controller.actors import BY_REFERENCE  # noqa: E402
from startup_floor import print_against  # noqa: E402

MEASURE = """
import json, sys, time
import ray
ray.init(address="local", num_cpus=4, include_dashboard=False)
time.sleep(3)

@ray.remote(num_cpus=1)
class Empty:
    pass

options = json.loads(sys.argv[1])
started = time.perf_counter()
actors = [Empty.options(**options).remote() for _ in range(3)]
ray.get([actor.__ray_ready__.remote() for actor in actors])
print(json.dumps(time.perf_counter() - started))
ray.shutdown()
"""

VARIANTS = {"no runtime environment": {}, "runtime environment (BY_REFERENCE)": {"runtime_env": BY_REFERENCE}}


def ready_s(options: dict) -> float:
    result = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(options)], capture_output=True, text=True,
                            check=True)
    return json.loads([line for line in result.stdout.splitlines() if line.strip()][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, options in VARIANTS.items():
            samples[name].append(ready_s(options))
            print(name, round(samples[name][-1], 3), flush=True)
    print_against(samples, "no runtime environment",
                  f"medians over {args.repeats} runs each | three empty actors ready, s | / no runtime environment")


if __name__ == "__main__":
    main()
