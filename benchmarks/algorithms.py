"""Held-out accuracy of each algorithm recipe (configs/algos/) on a task, short runs side by side.

    python benchmarks/algorithms.py [--steps 10] [--eval-rows 1000] [--seeds 0,1] [--recipes grpo,dapo]
                                    [--task configs/default.yaml] [section.field=value ...]

Each run is `python -m grpo_dist.launch --config TASK --config configs/algos/RECIPE.yaml`
with the given overrides, in one local Ray cluster, one after another: greedy accuracy on
the first `--eval-rows` held-out rows before training and after `--steps` steps. The baseline
is the task's own algorithm (recipe `task`: no algos file), measured in the same invocation.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import ray

from grpo_dist.config import load_config
from grpo_dist.eval import standard_error
from grpo_dist.trainer import Trainer

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
    return Trainer(config, output / name).run()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_bench", log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory() as output:
        for recipe in args.recipes.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                summary = run(recipe, seed, args, Path(output))
                before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
                rows.append(f"| {recipe} | {seed} | {before:.3f} | {after:.3f} | {100 * (after - before):+.1f} | "
                            f"{standard_error(after, summary['eval_rows']):.3f} | {summary['wall_seconds']:.0f} |")
    ray.shutdown()
    print(f"\n{args.steps} steps, held-out greedy accuracy on {args.eval_rows} rows\n")
    print("| recipe | seed | before | after | gain, points | stderr after | wall s |\n|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
