"""Where a real-model GRPO step's seconds go, from the run's own metrics, per setting, one invocation.

    python benchmarks/step_breakdown.py [--model FOLDER] [--steps 3] [--repeats 1]
        [--settings "rollout.engine=transformers;rollout.engine=vllm"]

Each setting (overrides, ',' between them) trains configs/smollm2_word_problems.yaml (the
real SmolLM2-135M-Instruct; --model defaults to scripts/real_model.py's folder) with the real
TrainingRun on one local Ray cluster of 2 CPUs, no evaluation or checkpoint; the settings take
turns `--repeats` times. Reported per setting, medians over the steps after the first (the
first warms up): the stages' seconds from metrics.jsonl (generate, reward, weight load on the
worker, the learner's reference and pi_old passes, gradient pass, optimizer step and the rest
of its train_step) and what is left of `time/step_s` outside them: the learner's weight export
and checksum, Ray's hand-offs and the driver's waits. Each run carries the 1-minute load
average before and after it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import ray

from grpo_dist.config.schema import load_config
from grpo_dist.controller.run import TrainingRun

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "smollm2_word_problems.yaml"
LEARNER_STAGES = ("reference_pass", "old_pass", "grad_pass", "optimizer")
COLUMNS = ("generate", "reward", "weight load", *LEARNER_STAGES, "learner other", "export, checksum, waits",
           "step")


def breakdown(record: dict[str, float]) -> dict[str, float]:
    """One step's seconds by stage; the learner's and the step's rests by subtraction."""
    learner = {stage: record[f"time/learner_{stage}_s"] for stage in LEARNER_STAGES}
    stages = {"generate": record["time/generate_s"], "reward": record["time/reward_s"],
              "weight load": record["time/sync_s"], **learner,
              "learner other": record["time/learn_s"] - sum(learner.values())}
    return {**stages, "export, checksum, waits": record["time/step_s"] - sum(stages.values()),
            "step": record["time/step_s"]}


def run(output: Path, name: str, overrides: list[str], steps: int) -> dict[str, float]:
    config = load_config(RECIPE, [
        f"trainer.steps={steps}", "trainer.eval_every=0", "data.eval=null", "trainer.save_final=false",
        "trainer.checkpoint_every=0", "trainer.progress=false", "trainer.loggers=[jsonl]",
        "trainer.samples_every=0", f"trainer.output_dir={output}", f"trainer.run_name={name}", *overrides,
    ])
    load_before = os.getloadavg()[0]
    TrainingRun(config, output / name).run()
    lines = (output / name / "metrics.jsonl").read_text().splitlines()
    timed = [breakdown(r) for r in map(json.loads, lines) if r["kind"] == "train"][1:]
    medians = {column: statistics.median(step[column] for step in timed) for column in COLUMNS}
    return {**medians, "load": f"{load_before:.1f}, {os.getloadavg()[0]:.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="the model folder (default: scripts/real_model.py's)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--settings", default="rollout.engine=transformers;rollout.engine=vllm")
    args = parser.parse_args()
    model = args.model or subprocess.check_output([sys.executable, str(ROOT / "scripts" / "real_model.py")],
                                                  text=True).strip().splitlines()[-1]
    os.environ["RAY_worker_niceness"] = "0"  # as a run's driver; Ray's default, 15, starves them on a shared machine
    ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_bench")
    settings = args.settings.split(";")
    print("| setting | " + " | ".join(COLUMNS) + " | load before, after |\n|---" + "|---:" * len(COLUMNS) + "|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for index, setting in enumerate(settings if repeat % 2 == 0 else settings[::-1]):
                overrides = [f"model.path={model}", *filter(None, setting.split(","))]
                result = run(Path(tmp), f"r{repeat}s{index}", overrides, args.steps)
                cells = " | ".join(f"{result[c]:.2f}" for c in COLUMNS)
                print(f"| {setting} | {cells} | {result['load']} |", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
