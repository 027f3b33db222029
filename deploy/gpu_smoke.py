"""GPU smoke test: a few GRPO steps with vLLM rollouts and the NCCL weight sync.

    python deploy/gpu_smoke.py                 # ~0.5B Qwen2, random weights, no hub
    python deploy/gpu_smoke.py --dry-run --size tiny   # CPU: build model + tokenizer, plan buckets

Builds a Qwen2-architecture model from a config (random weights) and a character-level
tokenizer made with `tokenizers`, saves both to a temporary folder, starts a Learner and a
vLLM RolloutWorker as Ray actors with one GPU each, and runs GRPO steps: generate, score
(a toy rule: the share of digits in the completion), learn, sync. Prints generation
tokens/s, learner tokens/s and the weight sync in milliseconds per step.

NCCL cannot place two ranks on one GPU, so the NCCL sync needs two GPUs (learner on one,
engine on the other). On a single GPU the script falls back to the object-store sync
(`--sync object-store`), which is what the CPU path uses, and says so.
"""

from __future__ import annotations

import argparse
import tempfile
import time
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
    parser.add_argument("--sync", choices=["auto", "nccl", "object-store"], default="auto",
                        help="auto: nccl with two or more GPUs, else object-store")
    parser.add_argument("--bucket-mb", type=int, default=256, help="NCCL bucket size")
    parser.add_argument("--sync-timeout-s", type=float, default=120.0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
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


def digit_share(text: str) -> float:
    """Toy reward with spread across a group: the share of digits in the completion."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    params = save_model(args.size, folder)
    print(f"model: Qwen2 {args.size}, {params / 1e6:.1f}M parameters, bfloat16, at {folder}")
    if args.dry_run:
        from transformers import AutoModelForCausalLM

        from grpo_dist.weights.nccl import plan_buckets

        state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).state_dict()
        buckets = plan_buckets(state, args.bucket_mb << 20)
        print(f"dry run: {len(state)} tensors in {len(buckets)} NCCL buckets of <= {args.bucket_mb} MiB")
        return
    run(args, folder)


def run(args: argparse.Namespace, folder: Path) -> None:
    import ray

    from grpo_dist.config import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig, VLLMConfig
    from grpo_dist.config import DataConfig
    from grpo_dist.data import build_prompts
    from grpo_dist.learner.worker import Learner
    from grpo_dist.net import free_port
    from grpo_dist.rollout.worker import RolloutWorker
    from grpo_dist.seeding import prompt_seed
    from grpo_dist.types import SamplingSettings

    gpus = torch.cuda.device_count()
    sync = args.sync if args.sync != "auto" else ("nccl" if gpus >= 2 else "object-store")
    if sync == "nccl" and gpus < 2:
        raise SystemExit("--sync nccl needs two GPUs: NCCL cannot put the learner and the engine on one device")
    share = 1.0 if gpus >= 2 else 0.5  # one GPU: learner and engine share it
    print(f"{gpus} GPU(s); weight sync: {sync}")

    ray.init(include_dashboard=False)
    model = ModelConfig(path=str(folder), dtype="bfloat16")
    rollout = RolloutConfig(
        engine="vllm", num_gpus=share, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
        vllm=VLLMConfig(gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=False),
    )
    learner = ray.remote(Learner).options(num_gpus=share).remote(
        model, AlgoConfig(lr=1e-5, minibatch_size=8 * args.group_size), LearnerConfig(num_gpus=share), rollout, 0)
    worker = ray.remote(RolloutWorker).options(num_gpus=share).remote(model, rollout, 0)
    ray.get([learner.__ray_ready__.remote(), worker.__ray_ready__.remote()])

    if sync == "nccl":
        host, port = ray.util.get_node_ip_address(), free_port()
        ray.get([learner.join_weight_group.remote(host, port, 2, args.sync_timeout_s),
                 worker.join_weight_group.remote(host, port, 1, 2, args.sync_timeout_s)],
                timeout=args.sync_timeout_s)
        plan = ray.get(learner.weight_plan.remote(args.bucket_mb << 20))

    rows = [{"prompt": f"{a}+{b}="} for a in range(40) for b in range(40)]
    prompts = build_prompts(rows, DataConfig(), build_tokenizer())
    sampling = SamplingSettings(n=args.group_size, temperature=1.0, max_new_tokens=args.max_new_tokens)
    print(f"{'step':>4} {'gen tok/s':>10} {'learn tok/s':>12} {'sync ms':>8} {'reward':>7}")
    for step in range(1, args.steps + 1):
        batch = prompts[(step - 1) * args.prompts: step * args.prompts]
        clock = time.perf_counter()
        groups = ray.get(worker.generate.remote(batch, sampling, [prompt_seed(0, step, i) for i in range(len(batch))]))
        generate_s = time.perf_counter() - clock
        for group in groups:
            group.rewards = [digit_share(c.text) for c in group.completions]
        metrics = ray.get(learner.train_step.remote(groups))

        clock = time.perf_counter()
        if sync == "nccl":
            ray.get([learner.send_weights.remote(plan), worker.receive_weights.remote(plan, step, args.sync_timeout_s, False)],
                    timeout=args.sync_timeout_s)
        else:
            ray.get(worker.load_weights.remote(learner.export_weights.remote(), step, False),
                    timeout=args.sync_timeout_s)
        sync_ms = (time.perf_counter() - clock) * 1000
        tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
        reward = sum(r for g in groups for r in g.rewards) / (len(groups) * args.group_size)
        print(f"{step:>4} {tokens / generate_s:>10.0f} {metrics['system/learn_tokens_per_s']:>12.0f} "
              f"{sync_ms:>8.1f} {reward:>7.3f}", flush=True)

    served, expected = ray.get([worker.checksum.remote(), learner.checksum.remote()])
    print("engine serves the learner's weights:", served == expected)
    ray.shutdown()


if __name__ == "__main__":
    main()
