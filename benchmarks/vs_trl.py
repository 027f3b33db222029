"""grpo_dist's default job against the same job in TRL's GRPOTrainer, in one invocation.

    .venv/bin/python benchmarks/vs_trl.py [--steps 150] [--order ours,trl]

Both runs: the built-in arithmetic model and data, the exact_answer reward, G=8, 32 prompts
per step, 8 new tokens, temperature 1, lr 1e-4 (constant), beta 0, clip 0.2, a
per-sequence mean loss with std-scaled group advantages, gradient clipping 1.0, one
optimizer step per batch, seed 0, on the CPU, and a greedy held-out evaluation on the
1000 eval rows before and after training only. Ours is `python -m grpo_dist.launch
trainer.steps=N trainer.eval_every=0` (the default job otherwise: its checkpoints and final
save included); TRL's is this file run with --trl-worker, which evaluates with the same
greedy decoding (grpo_dist's HFEngine) and the same reward.

TRL is never a dependency of grpo_dist: when `import trl` fails, TRL_VERSION is installed
without dependencies (they are grpo_dist's own: torch, transformers, accelerate, datasets)
into --trl-dir with `pip install --target`, and only the TRL run puts it on its path.

Each run is a fresh process timed from outside (wall), with its time to the first
optimizer step counted from its process start and the median seconds per step; the table
ends with TRL / ours. The machine's other load moves both; run it on a quiet one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--order", default="ours,trl", help="which runs, in which order (e.g. trl,ours)")
    parser.add_argument("--trl-dir", type=Path, default=Path.home() / ".cache" / "grpo_dist" / f"trl-{TRL_VERSION}",
                        help="where TRL is installed when the environment lacks it")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--trl-worker", type=Path, default=None, help=argparse.SUPPRESS)  # the TRL run's own process
    return parser.parse_args(argv)


# ------------------------------------------------------------------ ours


def run_ours(steps: int, workdir: Path) -> dict[str, Any]:
    """The default job with evaluations before and after only, as a user launches it."""
    command = [sys.executable, "-m", "grpo_dist.launch", f"trainer.steps={steps}", "trainer.eval_every=0",
               f"trainer.output_dir={workdir}", "trainer.run_name=ours", "trainer.progress=false",
               "cluster.address=local"]  # a cluster of its own, never another user's running one
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.time() - started
    if result.returncode != 0:
        raise RuntimeError(f"grpo_dist failed:\n{result.stderr[-3000:]}")
    run_dir = workdir / "ours"
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_s = [r["time/step_s"] for r in records if r["kind"] == "train"]
    return {"wall_s": wall, "first_step_s": summary["timeline"]["first_optimizer_step_s"],
            "step_s": statistics.median(step_s[1:] or step_s), "accuracy_before": summary["eval_accuracy_before"],
            "accuracy_after": summary["eval_accuracy_after"], "timeline": summary["timeline"]}


# ------------------------------------------------------------------ TRL


def trl_path(directory: Path) -> str | None:
    """The PYTHONPATH entry that makes TRL importable: none when it already is, else `directory`
    (installed there first, without dependencies)."""
    if importlib.util.find_spec("trl") is not None:
        return None
    if not (directory / "trl").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(directory),
                        f"trl=={TRL_VERSION}"], check=True)
    return str(directory)


def run_trl(steps: int, workdir: Path, trl_dir: Path) -> dict[str, Any]:
    extra = trl_path(trl_dir)
    out = workdir / "trl.json"
    paths = [str(ROOT), *([extra] if extra else []), os.environ.get("PYTHONPATH", "")]
    started = time.time()
    result = subprocess.run([sys.executable, __file__, "--trl-worker", str(out), "--steps", str(steps)], cwd=ROOT,
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)})
    wall = time.time() - started
    if result.returncode != 0:
        raise RuntimeError(f"TRL failed:\n{result.stderr[-3000:]}")
    return {"wall_s": wall, **json.loads(out.read_text())}


def trl_worker(steps: int, out: Path) -> None:
    """TRL's run, in its own process: evaluate, train `steps` steps, evaluate, write the numbers."""
    from grpo_dist.timeline import process_started

    origin = process_started()
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_dist.config import load_config, resolve_path
    from grpo_dist.data import prepare_data
    from grpo_dist.reward.rules import exact_answer
    from grpo_dist.rollout.hf_engine import HFEngine
    from grpo_dist.rollout.sampling import sampling_settings

    config = load_config(None, [])
    rollout, algo = config.rollout, config.algo
    torch.set_num_threads(os.cpu_count() or 1)
    data = prepare_data(config)
    engine = HFEngine(config.model.path, dtype=config.model.dtype)  # the greedy evaluation, as grpo_dist's

    def accuracy(model: Any) -> float:
        engine.model = model.eval()
        greedy = sampling_settings(rollout, greedy=True)
        groups = engine.generate([p.ids for p in data.eval], greedy, [0] * len(data.eval))
        return sum(exact_answer(p.text, g[0].text, p.row["answer"]) for p, g in zip(data.eval, groups)) / len(groups)

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [exact_answer(p, c, a) for p, c, a in zip(prompts, completions, answer)]

    ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.time())

    train = Dataset.from_list([{"prompt": p.text, "answer": p.row["answer"]} for p in data.train])
    completions = rollout.group_size * rollout.prompts_per_step
    args = GRPOConfig(
        output_dir=str(out.parent / "trl_run"), max_steps=steps, learning_rate=algo.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=algo.weight_decay, max_grad_norm=algo.max_grad_norm, optim="adamw_torch",
        per_device_train_batch_size=completions, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=rollout.group_size, max_completion_length=rollout.max_new_tokens,
        temperature=rollout.temperature, top_p=1.0, top_k=0, beta=algo.beta, epsilon=algo.clip_low,
        epsilon_high=algo.clip_high, num_iterations=algo.mu, loss_type="grpo", scale_rewards="group",
        use_cpu=True, bf16=False, seed=config.trainer.seed, report_to="none", save_strategy="no",
        logging_steps=10, disable_tqdm=True, dataloader_num_workers=0,
    )
    model = engine.model  # the built-in model, loaded once (trained in place by TRL)
    before = accuracy(model)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=train,
                          processing_class=engine.tokenizer, callbacks=[StepTimes()])
    model.train()
    train_started = time.time()
    trainer.train()
    after = accuracy(trainer.model)
    steps_s = [b - a for a, b in zip([train_started, *ends], ends)]
    out.write_text(json.dumps({"first_step_s": ends[0] - origin, "step_s": statistics.median(steps_s[1:] or steps_s),
                               "accuracy_before": before, "accuracy_after": after, "model": resolve_path(
                                   config.model.path)}))


# ------------------------------------------------------------------ table


def table(results: dict[str, dict[str, Any]], steps: int) -> str:
    rows = [("wall s", "wall_s", 1), ("first optimizer step s", "first_step_s", 1),
            ("s per step (median)", "step_s", 3), ("accuracy before", "accuracy_before", 3),
            ("accuracy after", "accuracy_after", 3)]
    names = list(results)
    lines = [f"{steps} steps | " + " | ".join(names) + (" | TRL / ours" if len(names) == 2 else ""),
             "---|" + "---|" * len(names) + ("---" if len(names) == 2 else "")]
    for label, key, digits in rows:
        values = [results[name][key] for name in names]
        ratio = ""
        if len(names) == 2 and not key.startswith("accuracy"):
            ratio = f" | {results['trl'][key] / results['ours'][key]:.2f}"
        lines.append(f"{label} | " + " | ".join(f"{v:.{digits}f}" for v in values) + ratio)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.trl_worker is not None:
        trl_worker(args.steps, args.trl_worker)
        return
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.order.split(","):
            workdir = Path(tmp) / name
            workdir.mkdir()
            results[name] = run_ours(args.steps, workdir) if name == "ours" else run_trl(args.steps, workdir,
                                                                                          args.trl_dir)
            print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'timeline'})}", flush=True)
    print(table(results, args.steps))
    if "ours" in results:
        timeline = results["ours"]["timeline"]
        print("ours, start:", json.dumps(timeline["start_s"]))
        print("ours, end:", json.dumps(timeline["end_s"]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
