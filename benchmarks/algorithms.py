"""Held-out accuracy of each algorithm recipe (configs/algos/) on a task, short runs side by side.

    python benchmarks/algorithms.py [--steps 10] [--eval-rows 1000] [--seeds 0,1] [--recipes grpo,dapo]
                                    [--task configs/default.yaml] [section.field=value ...]

Each run is `python -m grpo_dist.launch --config TASK --config configs/algos/RECIPE.yaml`
with the given overrides, in one local Ray cluster, one after another: greedy accuracy on
the first `--eval-rows` held-out rows before training and after `--steps` steps. The baseline
is the task's own algorithm (recipe `task`: no algos file), measured in the same invocation.
Runs with algo.dynamic_sampling (dapo) also get a line on what it cost: the share of groups
dropped as uninformative, the extra rounds, and the completions generated beyond the first round.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import ray

from grpo_dist.config.schema import load_config
from grpo_dist.observe.evaluation import standard_error
from grpo_dist.controller.run import TrainingRun

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ["task", "grpo", "dapo", "dr_grpo", "gspo"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-rows", type=int, default=1000)
    parser.add_argument("--seeds", default="0", help="comma-separated trainer.seed values")
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {RECIPES}")
    parser.add_argument("--task", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("overrides", nargs="*", help="section.field=value, applied to every run")
    return parser.parse_args(argv)


def run(recipe: str, seed: int, args: argparse.Namespace, output: Path) -> dict:
    recipes = [args.task] + ([] if recipe == "task" else [ROOT / "configs" / "algos" / f"{recipe}.yaml"])
    name = f"{recipe}-{seed}"
    config = load_config(recipes, [f"trainer.steps={args.steps}", "trainer.eval_every=0", f"trainer.seed={seed}",
                                   f"data.eval_rows={args.eval_rows}", "trainer.progress=false",
                                   "trainer.save_final=false", "trainer.checkpoint_every=0",
                                   f"trainer.output_dir={output}", f"trainer.run_name={name}", *args.overrides])
    return TrainingRun(config, output / name).run()


def dynamic_sampling(run_dir: Path, first_round: int) -> str | None:
    """A table row on dynamic sampling's cost over the run's steps, or None when it was off."""
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "train" and "rollout/dynamic_rounds" in r]
    if not steps:
        return None
    dropped = sum(r["rollout/dynamic_dropped_fraction"] for r in steps) / len(steps)
    rounds = sum(r["rollout/dynamic_rounds"] for r in steps) / len(steps)
    extra = sum(r["rollout/dynamic_extra_completions"] for r in steps) / (first_round * len(steps))
    short = sum(r["rollout/dynamic_bound_reached"] for r in steps)
    return (f"| {run_dir.name} | {100 * dropped:.1f} % | {rounds:.2f} | {100 * extra:+.1f} % | {short:.0f} of "
            f"{len(steps)} |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_bench", log_to_driver=False)
    rows, dynamic = [], []
    with tempfile.TemporaryDirectory() as output:
        for recipe in args.recipes.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                summary = run(recipe, seed, args, Path(output))
                config = load_config(Path(summary["run_dir"]) / "config.yaml")
                dynamic.append(dynamic_sampling(Path(summary["run_dir"]),
                                                config.rollout.prompts_per_step * config.rollout.group_size))
                before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
                rows.append(f"| {recipe} | {seed} | {before:.3f} | {after:.3f} | {100 * (after - before):+.1f} | "
                            f"{standard_error(after, summary['eval_rows']):.3f} | {summary['wall_seconds']:.0f} |")
    ray.shutdown()
    print(f"\n{args.steps} steps, held-out greedy accuracy on {args.eval_rows} rows\n")
    print("| recipe | seed | before | after | gain, points | stderr after | wall s |\n|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    if any(dynamic):
        print("\nDynamic sampling, means over the steps: groups dropped as uninformative (of those generated), "
              "generation rounds, completions beyond the first round (of a round's), steps that hit the bound\n")
        print("| run | dropped | rounds | extra generation | bound reached |\n|---|---:|---:|---:|---:|")
        print("\n".join(row for row in dynamic if row))


if __name__ == "__main__":
    main()
