"""The weight hand-off of the real-model recipe (export, object store, each worker's load, both
checksums): this checkout against a baseline commit, per engine, alternating, in one invocation.

    .venv/bin/python benchmarks/handoff.py [--baseline main] [--engines transformers,vllm] [--pushes 4] [--repeats 2]

Each checkout starts the recipe's actors (configs/smollm2_word_problems.yaml on SmolLM2-135M-
Instruct from scripts/real_model.py, one engine) in a fresh process with a local Ray cluster, and
times what a sync step waits for between the optimizer step and the next generation, as the
driver sees it: `WeightPublisher.publish` (the learner's export into the object store, each
worker's load with its checksum, queued) and then `verify_through` (the wait for those loads and
the learner's own checksum, compared). The median over --pushes pushes, after a first one.
Actors run at niceness 0 (RAY_worker_niceness), as the driver does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import ROOT, print_medians, unpack  # noqa: E402

PUSHES = """
import json, statistics, sys, time
from grpo_dist.config.schema import load_config
from grpo_dist.controller.cluster import connect_ray
from grpo_dist.controller.run import TrainingRun
model, engine, out, pushes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
config = load_config(["configs/smollm2_word_problems.yaml"],
                     [f"model.path={model}", f"rollout.engine={engine}", f"trainer.output_dir={out}"])
connect_ray(config, None)
trainer = TrainingRun(config, run_dir=__import__("pathlib").Path(out) / "run")
trainer.start()
seconds = []
for version in range(1, pushes + 2):
    started = time.perf_counter()
    trainer.publisher.publish(version)
    trainer.publisher.verify_through(version)
    seconds.append(time.perf_counter() - started)
trainer.stop()
print(json.dumps({"push_and_verify_s": statistics.median(seconds[1:])}))
"""


def pushes_s(root: Path, model: str, engine: str, out: Path, pushes: int) -> float:
    result = subprocess.run([sys.executable, "-c", PUSHES, model, engine, str(out), str(pushes)], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root), "RAY_worker_niceness": "0"},
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])["push_and_verify_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline")
    parser.add_argument("--engines", default="transformers,vllm")
    parser.add_argument("--pushes", type=int, default=4, help="timed pushes per run, after a first one")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model = subprocess.run([sys.executable, "scripts/real_model.py"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.strip().splitlines()[-1]
    runs: dict[str, dict[str, list[float]]] = {"baseline": {}, "this": {}}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"baseline": unpack(args.baseline, Path(tmp) / "baseline"), "this": ROOT}
        for repeat in range(args.repeats):
            for name in roots if repeat % 2 == 0 else list(roots)[::-1]:
                for engine in args.engines.split(","):
                    seconds = pushes_s(roots[name], model, engine, Path(tmp) / f"{name}-{engine}-{repeat}",
                                       args.pushes)
                    runs[name].setdefault(f"{engine}: push and verify, s", []).append(seconds)
                    print(name, engine, round(seconds, 3), flush=True)
    print_medians(runs, args.baseline, args.repeats, digits=3)


if __name__ == "__main__":
    main()
