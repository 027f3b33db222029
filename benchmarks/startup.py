"""Seconds from the command to the first optimizer step, and from the last step to exit:
this checkout against a baseline commit, the default job, alternating, in one invocation.

    .venv/bin/python benchmarks/startup.py [--baseline main] [--steps 10] [--repeats 2]
    .venv/bin/python benchmarks/startup.py --job real [--engine transformers] --steps 1

`--job real` runs the real-model recipe as benchmarks/startup_floor.py does (no evaluation;
`--engine` overrides the recipe's engine), and `first_step_start_s` is when its first step began
(its end less `time/step_s`: the step itself is compute no start can save).

Both are measured from outside, the same way for each: the command starts at the time the
process is spawned; the first optimizer step ends at step 1's `time/learn_ended` in
metrics.jsonl (unix seconds, written by the learner); the last step ends at the last step's
`time/learn_ended`, and exit is when the process has ended (the final evaluation, saving, the
report and Ray's shutdown lie between). The baseline is `git archive BASELINE` unpacked in a
temporary folder and run with the same interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from vs_trl import JOBS, real_model_folder

ROOT = Path(__file__).resolve().parent.parent


def unpack(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def one_run(root: Path, steps: int, out: Path, job: tuple[str, ...] = ()) -> dict[str, float]:
    """The default job, or the one `job`'s arguments make (a --config and overrides), for `steps`."""
    command = [sys.executable, "-m", "grpo_dist.launch", *job, f"trainer.steps={steps}", f"trainer.output_dir={out}",
               "cluster.address=local",  # never another user's running cluster
               "trainer.run_name=run", "trainer.progress=false"]
    spawned = time.time()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    ended = time.time()
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    first_step_s = train[0]["time/learn_ended"] - spawned
    start = json.loads((out / "run" / "summary.json").read_text())["timeline"]
    return {"first_step_s": first_step_s, "first_step_start_s": first_step_s - train[0]["time/step_s"],
            # the start's own phases (observe/timeline.py): the wait for the actors after the data, the
            # slowest actor's construction, the first comparison of served and learned weights
            "actors_wait_s": start["start_s"]["actors"], "slowest_actor_ready_s": max(start["actor_ready_s"].values()),
            "first_weight_check_s": start["start_s"]["first_weight_check"],
            "last_step_to_exit_s": ended - train[-1]["time/learn_ended"],
            "step_s": statistics.median(r["time/step_s"] for r in train[1:] or train), "wall_s": ended - spawned}


def real_job(engine: str | None) -> tuple[tuple[str, ...], str, str]:
    """The real-model recipe's launch arguments, without evaluation, on `engine` (default: the
    recipe's); the engine it runs; the model's folder."""
    model = real_model_folder()
    engine = engine or recipe_engine(model, JOBS["real"]["config"])
    return ("--config", JOBS["real"]["config"], f"model.path={model}", "data.eval=null", f"rollout.engine={engine}"), engine, model


def recipe_engine(model: str, config: str) -> str:
    """The engine the recipe names (`auto` resolved as a rollout worker on the CPU resolves it)."""
    from grpo_dist.config.schema import load_config
    from grpo_dist.rollout.worker import resolve_engine

    return resolve_engine(load_config(str(ROOT / config), [f"model.path={model}"]).rollout.engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--job", choices=["default", "real"], default="default")
    parser.add_argument("--engine", choices=["vllm", "transformers"], default=None,
                        help="the real job's engine (default: the recipe's)")
    args = parser.parse_args()
    job = real_job(args.engine)[0] if args.job == "real" else ()
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"baseline": unpack(args.baseline, Path(tmp) / "baseline"), "this": ROOT}
        for repeat in range(args.repeats):
            for name, root in roots.items():
                result = one_run(root, args.steps, Path(tmp) / f"{name}-{repeat}", job)
                runs[name].append(result)
                print(name, json.dumps({k: round(v, 2) for k, v in result.items()}), flush=True)
    print_medians({name: {key: [r[key] for r in results] for key in results[0]} for name, results in runs.items()},
                  args.baseline, args.repeats)


def print_medians(runs: dict[str, dict[str, list[float]]], baseline: str, repeats: int, digits: int = 2) -> None:
    """The table: each measure's median for the baseline and this checkout, and their ratio."""
    print(f"\nmedians over {repeats} runs each | baseline ({baseline}) | this | this / baseline")
    print("---|---|---|---")
    for key in runs["this"]:
        base, this = (statistics.median(runs[name][key]) for name in ("baseline", "this"))
        print(f"{key} | {base:.{digits}f} | {this:.{digits}f} | {this / base:.2f}")


if __name__ == "__main__":
    main()
