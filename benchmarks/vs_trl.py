"""grpo_dist against TRL's GRPOTrainer on the same job, in one invocation, TRL run as its users run it.

    .venv/bin/python benchmarks/vs_trl.py [--job toy|real] [--steps N] [--modes trl,sync,fast,async] [--repeats 1]

Jobs: `toy` is the built-in default (arithmetic model and data, exact_answer, G=8, 32 prompts,
8 new tokens, lr 1e-4, 150 steps, greedy evaluation of the 1000 held-out rows before and after);
`real` is configs/smollm2_word_problems.yaml on SmolLM2-135M-Instruct (Q4_1 dequantized, from
scripts/real_model.py) with the issue's sizes: 8 prompts x G=8 x up to 64 tokens, 6 steps, greedy
evaluation of 100 held-out rows before and after. Both sides get the same settings (G, prompts
per step, max new tokens, temperature, lr, beta, clip, weight decay, gradient clip, seed).

- trl: benchmarks/trl_worker.py in its own process, nothing of grpo_dist imported: the prompts
  rendered here once (chat template included, checked to tokenize to grpo_dist's own ids), TRL's
  and transformers' own loading, a batched `model.generate` greedy evaluation, the same reward
  rule (its own copy, tested equal to grpo_dist's in tests/test_trl_worker.py).
- sync, fast, async: `python -m grpo_dist.launch` as a user runs it, evaluations before and after
  only; sync is the job as configured, fast and async add the overrides in MODES.

TRL is never a dependency of grpo_dist: when `import trl` fails, TRL_VERSION is installed without
dependencies into --trl-dir (`pip install --target`) and only the TRL run puts it on its path.
Every run is a fresh process timed from outside: wall, first optimizer step (from its spawn),
the median step, completion tokens per second of training, the mean training reward of step 1
(both sides sample the same initial policy: equal but for the draw) and over all steps,
held-out greedy accuracy with its standard error. Repeats alternate the order. The load average
is printed with every run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRL_VERSION = "1.16.0"
JOBS: dict[str, dict[str, Any]] = {
    "toy": {"config": None, "overrides": [], "steps": 150},
    "real": {"config": "configs/smollm2_word_problems.yaml", "overrides": ["rollout.max_new_tokens=64"], "steps": 6},
}
MODES = {  # grpo_dist's runs: the job's own settings plus these
    "sync": [],
    "fast": ["trainer.overlap_learning=on"],
    "async": ["trainer.mode=async", "trainer.max_staleness=1"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="toy")
    parser.add_argument("--steps", type=int, default=None, help="the job's own when absent (toy 150, real 6)")
    parser.add_argument("--modes", default="trl,sync,fast,async", help="which runs, in which order")
    parser.add_argument("--fast", default=None, help="the fast mode's overrides, comma-separated (replaces MODES')")
    parser.add_argument("--repeats", type=int, default=1, help="each repeat runs the modes in the other order")
    parser.add_argument("--set", nargs="*", default=[], metavar="section.field=value",
                        help="more overrides for both sides, e.g. data.eval_rows=10 for a quick try")
    parser.add_argument("--model", default=None, help="the real job's model folder (default: scripts/real_model.py's)")
    parser.add_argument("--trl-dir", type=Path, default=Path.home() / ".cache" / "grpo_dist" / f"trl-{TRL_VERSION}",
                        help="where TRL is installed when the environment lacks it")
    parser.add_argument("--out", type=Path, default=None, help="write every run's results as JSON here")
    return parser.parse_args(argv)


def job_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The job's recipe and overrides: its steps, evaluations before and after only, its model."""
    job = JOBS[args.job]
    overrides = [*job["overrides"], f"trainer.steps={args.steps or job['steps']}", "trainer.eval_every=0", *args.set]
    if args.job == "real":
        overrides.append(f"model.path={real_model_folder(args.model)}")
    return job["config"], overrides


def real_model_folder(given: str | None = None) -> str:
    """`given`, else the folder scripts/real_model.py prepares (cached) and prints."""
    return given or subprocess.run([sys.executable, "scripts/real_model.py"], cwd=ROOT, check=True,
                                   capture_output=True, text=True).stdout.strip().splitlines()[-1]


def load() -> str:
    return os.getloadavg()[0].__format__(".1f")


# ------------------------------------------------------------------ ours


def run_ours(config: str | None, overrides: list[str], per_step: int, workdir: Path) -> dict[str, Any]:
    """`python -m grpo_dist.launch` with the job's settings, as a user launches it."""
    command = [sys.executable, "-m", "grpo_dist.launch", *(["--config", config] if config else []), *overrides,
               f"trainer.output_dir={workdir}", "trainer.run_name=ours", "trainer.progress=false",
               "cluster.address=local"]  # a cluster of its own, never another user's running one
    spawned = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.time() - spawned
    if result.returncode != 0:
        raise RuntimeError(f"grpo_dist failed:\n{result.stderr[-3000:]}")
    summary = json.loads((workdir / "ours" / "summary.json").read_text())
    records = [json.loads(line) for line in (workdir / "ours" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    step_s = [r["time/step_s"] for r in train]
    tokens = sum(r["rollout/completion_length"] * per_step for r in train)
    return {"wall_s": wall, "first_step_s": train[0]["time/learn_ended"] - spawned,
            "step_s": statistics.median(step_s[1:] or step_s), "tokens_per_s": tokens / sum(step_s),
            "reward_first_step": train[0]["reward/mean"],
            "reward_mean": statistics.fmean(r["reward/mean"] for r in train),
            "length_first_step": train[0]["rollout/completion_length"],
            "length_last_step": train[-1]["rollout/completion_length"],
            "accuracy_before": summary["eval_accuracy_before"], "accuracy_after": summary["eval_accuracy_after"],
            "eval_rows": summary["eval_rows"]}


# ------------------------------------------------------------------ TRL


def trl_job(config: str | None, overrides: list[str]) -> dict[str, Any]:
    """What the TRL process gets: the model, the rendered prompts and answers, the reward's name,
    the settings. The prompt texts must tokenize (as TRL tokenizes them) to grpo_dist's own ids."""
    from transformers import AutoTokenizer

    from grpo_dist.config.schema import load_config, resolve_path
    from grpo_dist.tasks.data import prepare_data

    cfg = load_config(config, overrides)
    data = prepare_data(cfg)
    model = resolve_path(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(model)
    for prompt in [*data.train, *data.eval]:
        if tokenizer(prompt.text)["input_ids"] != list(prompt.ids):
            raise SystemExit(f"prompt {prompt.index} tokenizes differently from its text; TRL would see other tokens")
    (reward,) = [f.name for f in cfg.reward.functions]
    rollout, algo = cfg.rollout, cfg.algo
    answer = cfg.data.answer_field
    return {"model": model, "reward": reward, "threads": os.cpu_count() or 1,
            "train": [{"prompt": p.text, "answer": str(p.row[answer])} for p in data.train],
            "eval": [{"prompt": p.text, "answer": str(p.row[answer])} for p in data.eval],
            "settings": {"steps": cfg.trainer.steps, "lr": algo.lr, "weight_decay": algo.weight_decay,
                         "max_grad_norm": algo.max_grad_norm, "group_size": rollout.group_size,
                         "prompts_per_step": rollout.prompts_per_step, "max_new_tokens": rollout.max_new_tokens,
                         "temperature": rollout.temperature, "beta": algo.beta, "clip_low": algo.clip_low,
                         "clip_high": algo.clip_high, "mu": algo.mu, "seed": cfg.trainer.seed}}


def trl_path(directory: Path) -> str | None:
    """The PYTHONPATH entry that makes TRL importable: none when it already is, else `directory`
    (installed there first, without dependencies)."""
    if importlib.util.find_spec("trl") is not None:
        return None
    if not (directory / "trl").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(directory),
                        f"trl=={TRL_VERSION}"], check=True)
    return str(directory)


def run_trl(job: dict[str, Any], workdir: Path, trl_dir: Path) -> dict[str, Any]:
    """benchmarks/trl_worker.py on `job`, with only TRL added to the path (never this checkout)."""
    extra = trl_path(trl_dir)
    job_file, out = workdir / "job.json", workdir / "trl.json"
    job_file.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    spawned = time.time()
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trl_worker.py"), str(job_file), str(out)],
                            cwd=workdir, capture_output=True, text=True, env={**env, **({"PYTHONPATH": extra} if extra
                                                                                          else {})})
    wall = time.time() - spawned
    if result.returncode != 0:
        raise RuntimeError(f"TRL failed:\n{result.stderr[-3000:]}")
    measured = json.loads(out.read_text())
    return {"wall_s": wall, "first_step_s": measured.pop("first_step_at") - spawned, **measured}


# ------------------------------------------------------------------ table


def with_stderr(accuracy: float, rows: int) -> str:
    return f"{accuracy:.3f} ± {math.sqrt(accuracy * (1 - accuracy) / rows):.3f}"


def table(results: dict[str, list[dict[str, Any]]], steps: int) -> str:
    """Medians over the repeats per mode, and TRL / each of ours (for tokens/s: ours / TRL)."""
    rows = [("wall s", "wall_s"), ("first optimizer step s", "first_step_s"), ("s per step (median)", "step_s"),
            ("completion tokens/s", "tokens_per_s"), ("training reward, step 1", "reward_first_step"),
            ("training reward, mean over the steps", "reward_mean"), ("completion length, step 1", "length_first_step"),
            ("completion length, last step", "length_last_step"), ("accuracy before", "accuracy_before"),
            ("accuracy after", "accuracy_after")]
    names = list(results)
    ours = [name for name in names if name != "trl"] if "trl" in names else []
    header = [f"{steps} steps", *names, *(f"TRL / {name}" for name in ours)]
    lines = [" | ".join(header), "|".join("---" for _ in header)]
    for label, key in rows:
        median = {name: statistics.median(r[key] for r in results[name]) for name in names}
        if key.startswith("accuracy"):
            cells = [with_stderr(median[name], results[name][0]["eval_rows"]) for name in names]
            ratios = ["" for _ in ours]
        elif key.startswith(("reward", "length")):  # step 1 samples the same policy on both sides
            digits = 3 if key.startswith("reward") else 1
            cells, ratios = [f"{median[name]:.{digits}f}" for name in names], ["" for _ in ours]
        else:
            cells = [f"{median[name]:.2f}" for name in names]
            ratios = [f"{(median[n] / median['trl'] if key == 'tokens_per_s' else median['trl'] / median[n]):.2f}"
                      for n in ours]
        lines.append(" | ".join([label, *cells, *ratios]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config, overrides = job_overrides(args)
    job = trl_job(config, overrides)
    per_step = job["settings"]["group_size"] * job["settings"]["prompts_per_step"]
    modes = {**MODES, **({"fast": args.fast.split(",")} if args.fast else {})}
    names = args.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in names if repeat % 2 == 0 else names[::-1]:
                workdir = Path(tmp) / f"{name}-{repeat}"
                workdir.mkdir()
                load_before = load()
                result = (run_trl(job, workdir, args.trl_dir) if name == "trl"
                          else run_ours(config, [*overrides, *modes[name]], per_step, workdir))
                results[name].append({**result, "load": f"{load_before}-{load()}"})
                print(f"{name}: {json.dumps(results[name][-1])}", flush=True)
    print(f"\njob {args.job}; fast = {' '.join(modes['fast'])}; async = {' '.join(modes['async'])}")
    print(table(results, job["settings"]["steps"]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
