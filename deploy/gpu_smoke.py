"""GPU smoke test: a few GRPO steps of the real TrainingRun with vLLM rollouts and the NCCL weight sync.

    python deploy/gpu_smoke.py                          # ~0.5B Qwen2, random weights, no hub
    python deploy/gpu_smoke.py --mode async             # rollouts one version ahead of the learner
    python deploy/gpu_smoke.py --dry-run --size tiny    # CPU: build model + tokenizer, plan buckets

Builds a Qwen2-architecture model from a config (random weights) and a character-level
tokenizer made with `tokenizers`, saves both with a small addition dataset to a temporary
folder, and runs `grpo_dist.controller.run.TrainingRun` on them: one vLLM rollout worker and the
learner, one GPU each (half a GPU each on a one-GPU machine), rewards `exact_answer` plus
`length_penalty` (random weights never answer right; the penalty gives each group some
spread). Prints generation tokens/s, learner tokens/s and the seconds the engine spent taking
weights, per step, then the run's summary.

NCCL cannot place two ranks on one GPU, so the NCCL sync needs two GPUs (learner on one,
engine on the other). On a single GPU the trainer's `weight_sync: auto` picks the object
store (fractional GPUs), which is what the CPU path uses; the script says which it got.

With three or more GPUs the learner runs sharded (`learner.sharding=fsdp`) over all GPUs but
the engine's, one whole GPU per rank (`--learner-ranks` sets another number; 1: unsharded).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

SIZES = {  # (hidden, intermediate, layers, heads, kv_heads)
    "0.5b": (1024, 4864, 28, 16, 2),  # ~0.48B parameters with this tokenizer
    "tiny": (64, 128, 2, 2, 1),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync", help="trainer.mode (async: staleness 1)")
    parser.add_argument("--engine", choices=["vllm", "transformers"], default="vllm", help="rollout.engine")
    parser.add_argument("--sync", choices=["auto", "nccl", "object_store"], default="auto",
                        help="trainer.weight_sync; auto: nccl with two or more GPUs, else object_store")
    parser.add_argument("--bucket-mb", type=int, default=256, help="NCCL bucket size")
    parser.add_argument("--sync-timeout-s", type=float, default=120.0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--output-dir", default=None, help="where the run directory goes (default: a temporary one)")
    parser.add_argument("--learner-ranks", type=int, default=None,
                        help="fsdp learner ranks, a GPU each (default: every GPU but the engine's when >= 3)")
    parser.add_argument("--dry-run", action="store_true", help="build and save the model, plan buckets, stop")
    return parser.parse_args(argv)


def build_tokenizer():
    """Character-level (grpo_dist/tasks/tiny.py): <pad>=0, <eos>=1, <unk>=2, then one id per character."""
    from grpo_dist.tasks.tiny import build_tokenizer as tiny_tokenizer

    return tiny_tokenizer()


def build_model(size: str, vocab_size: int) -> torch.nn.Module:
    """A Qwen2ForCausalLM with random weights; vocab_size is the tokenizer's length (vLLM needs it)."""
    from grpo_dist.tasks.tiny import build_model as tiny_model

    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    model = tiny_model("qwen2", vocab_size, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                       head_dim=hidden // heads, intermediate_size=intermediate, max_positions=1024)
    return model.to(torch.bfloat16)


def save_model(size: str, folder: Path) -> int:
    """Write model and tokenizer to `folder`; returns the parameter count."""
    tokenizer = build_tokenizer()
    model = build_model(size, len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def save_dataset(folder: Path, rows: int = 2000) -> None:
    """train.jsonl and eval.jsonl of `a+b=` prompts with their sums, for exact_answer."""
    problems = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(100) for b in range(100)]
    for name, part in (("train", problems[:rows]), ("eval", problems[rows : rows + 64])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in part))


def smoke_config(args: argparse.Namespace, folder: Path, gpus: int, output_dir: Path):
    """The run's config for this machine: a GPU each for learner and engine when there are
    two, half of one each when there is one, none on a CPU."""
    from grpo_dist.config.schema import load_config

    share = 1.0 if gpus >= 2 else 0.5 if gpus == 1 else 0.0
    ranks = args.learner_ranks or (gpus - 1 if gpus >= 3 else 1)
    sharded = [f"learner.num_ranks={ranks}", "learner.sharding=fsdp"] if ranks > 1 else []
    return load_config(None, [*sharded,
        f"model.path={folder}", "model.dtype=bfloat16",
        f"data.train={folder / 'train.jsonl'}", f"data.eval={folder / 'eval.jsonl'}",
        f"rollout.engine={args.engine}", f"rollout.num_gpus={share}", f"rollout.num_cpus={1 if share else 0.5}",
        f"rollout.group_size={args.group_size}", f"rollout.prompts_per_step={args.prompts}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.chunk_prompts=16",
        f"rollout.vllm.gpu_memory_utilization={args.gpu_memory_utilization}", f"rollout.vllm.enforce_eager={not share}",
        "rollout.vllm.cpu_kv_cache_gb=0.25",
        f"learner.num_gpus={share}", f"learner.num_cpus={1 if share else 0.5}",
        "algo.lr=1e-5", f"algo.minibatch_size={8 * args.group_size if args.prompts % 8 == 0 else 'null'}",
        "reward.functions=[{name: exact_answer}, {name: length_penalty, weight: 0.5, "
        f"kwargs: {{soft_length: {max(args.max_new_tokens // 4, 1)}, max_length: {args.max_new_tokens}}}}}]",
        f"trainer.mode={args.mode}", f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.save_final=false",
        "trainer.progress=false", "trainer.samples_every=0", "trainer.loggers=[jsonl]",
        f"trainer.weight_sync={args.sync}", f"trainer.weight_sync_bucket_mb={args.bucket_mb}",
        f"trainer.weight_sync_timeout_s={args.sync_timeout_s}", f"trainer.output_dir={output_dir}",
        "trainer.run_name=gpu_smoke",
    ])


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    params = save_model(args.size, folder)
    print(f"model: Qwen2 {args.size}, {params / 1e6:.1f}M parameters, bfloat16, at {folder}")
    if args.dry_run:
        from transformers import AutoModelForCausalLM

        from grpo_dist.weights.buckets import plan_buckets

        state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).state_dict()
        buckets = plan_buckets(state, args.bucket_mb << 20)
        print(f"dry run: {len(state)} tensors in {len(buckets)} NCCL buckets of <= {args.bucket_mb} MiB")
        return None
    save_dataset(folder)
    return run(args, folder)


def run(args: argparse.Namespace, folder: Path) -> dict:
    import ray

    from grpo_dist.config.schema import resolve_weight_sync
    from grpo_dist.controller.run import TrainingRun

    gpus = torch.cuda.device_count()
    output_dir = Path(args.output_dir or folder / "runs")
    config = smoke_config(args, folder, gpus, output_dir)
    print(f"{gpus} GPU(s); engine {args.engine}; weight sync {resolve_weight_sync(config)}; mode {args.mode}; "
          f"learner ranks {config.learner.num_ranks}, sharding {config.learner.sharding}")
    ray.init(include_dashboard=False)
    try:
        summary = TrainingRun(config, output_dir / "gpu_smoke").run()
    finally:
        ray.shutdown()
    lines = (output_dir / "gpu_smoke" / "metrics.jsonl").read_text().splitlines()
    print(f"{'step':>4} {'gen tok/s':>10} {'learn tok/s':>12} {'sync s':>7} {'staleness':>9} {'reward':>7}")
    for r in (r for r in map(json.loads, lines) if r["kind"] == "train"):
        print(f"{r['step']:>4} {r['system/generate_tokens_per_s']:>10.0f} {r['system/learn_tokens_per_s']:>12.0f} "
              f"{r['time/sync_s']:>7.3f} {r['rollout/staleness_max']:>9.0f} {r['reward/mean']:>7.3f}")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
