"""Peak memory and tokens/s of one learner step against learner.micro_batch_size.

    python benchmarks/learner_memory.py [--sizes null,4,2,1 --sequences 8 --completion-tokens 512]

A Llama of about 35M parameters (hidden 512, 6 layers, vocabulary 32000) is built from a
config with random weights. Each setting runs in a fresh subprocess: a real Learner takes
one GRPO step on the same synthetic batch (`--sequences` sequences of 64 prompt and
`--completion-tokens` completion tokens, non-binary rewards). Reported per setting: the
highest resident memory during the step above the resident memory before it (sampled every
2 ms), the process's peak resident memory, and completion tokens per second; the whole batch
at once (`null`) is the baseline, measured in the same run, and the ratios are against it.
On a GPU (`--device cuda`) memory is torch's peak allocation during the step instead.

    python benchmarks/learner_memory.py --ranks 1,2,4 [--bucket-mb 16]

The sharded case instead: for each K, K rank processes (gloo) take one step with
learner.sharding=fsdp (K = 1: one unsharded learner, the baseline), and `none` with the
largest K for the step time of replicated ranks. Reported per rank (the largest): the bytes
of parameters + gradients + AdamW state it holds (the float32 masters' shards, and with
bfloat16 nothing else: FSDP casts them per layer), its peak resident memory, the step time,
and, for fsdp, the extra resident memory of publishing the weights bucket by bucket
(`--bucket-mb`) above what the rank held before it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from grpo_dist.observe.memory import resident_mb

PROMPT_TOKENS = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="null,4,2,1", help="micro_batch_size values; null = whole batch")
    parser.add_argument("--sequences", type=int, default=8, help="sequences in the batch (groups of 8)")
    parser.add_argument("--completion-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ranks", help="the sharded case: numbers of fsdp ranks, e.g. 1,2,4")
    parser.add_argument("--bucket-mb", type=int, default=16, help="the sharded case: publish bucket size")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setting, print JSON
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # internal: the sharded case's rank
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sharding", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build_model(folder: Path) -> int:
    """A ~35M-parameter Llama with the built-in task's tokenizer (token ids are synthetic)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from grpo_dist.config.schema import resolve_path

    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(resolve_path("builtin:arithmetic/model")).save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def synthetic_groups(sequences: int, completion_tokens: int, group_size: int) -> list:
    """Fixed random prompts and completions; rewards spread over [0, 1]."""
    from grpo_dist.common.types import Completion, Group

    generator = torch.Generator().manual_seed(0)
    groups = []
    for _ in range(sequences // group_size):
        prompt = torch.randint(2, 32000, (PROMPT_TOKENS,), generator=generator).tolist()
        completions = [Completion(torch.randint(2, 32000, (completion_tokens,), generator=generator).tolist(),
                                  [-10.0] * completion_tokens, "", "length") for _ in range(group_size)]
        rewards = torch.rand(group_size, generator=generator).tolist()
        groups.append(Group(prompt_index=len(groups), row={}, prompt="", prompt_ids=prompt,
                            completions=completions, policy_version=0, rewards=rewards))
    return groups


class PeakResident(threading.Thread):
    """Samples this process's resident memory every 2 ms until stopped; keeps the highest."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.running = resident_mb(), True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, resident_mb())
            time.sleep(0.002)

    def stop(self) -> float:
        self.running = False
        self.join()
        return max(self.peak, resident_mb())


def make_learner(args: argparse.Namespace, group_size: int, micro_batch_size: str) -> object:
    from grpo_dist.config.schema import load_config
    from grpo_dist.learner.worker import Learner

    config = load_config(None, [
        f"model.path={args.model}", f"model.dtype={args.dtype}", f"learner.threads={args.threads}",
        f"learner.micro_batch_size={micro_batch_size}", f"learner.num_gpus={int(args.device == 'cuda')}",
        f"rollout.group_size={group_size}", f"rollout.prompts_per_step={args.sequences // group_size}",
        f"rollout.max_new_tokens={args.completion_tokens}", "algo.lr=1e-5",
        f"learner.num_ranks={args.world}", f"learner.sharding={args.sharding}",
    ])
    return Learner(config.model, config.algo, config.learner, config.rollout, seed=0)


def local_bytes(tensor: torch.Tensor | None) -> int:
    """The bytes of `tensor` this process holds (a DTensor: its shard)."""
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def run_rank(args: argparse.Namespace) -> dict[str, float]:
    """The sharded case: one rank of `args.world` takes one step, then publishes; this rank's bytes and times."""
    learner = make_learner(args, 8, "1")
    if args.world > 1:
        learner.join_ranks("127.0.0.1", args.port, args.rank, args.world)
    groups = synthetic_groups(args.sequences, args.completion_tokens, 8)
    sampler = PeakResident()
    sampler.start()
    started = time.perf_counter()
    learner.train_step(groups)
    step_s = time.perf_counter() - started
    compute = {id(p) for p in learner.policy.parameters()} - {id(p) for p in learner.weights.params}
    state = sum(local_bytes(p) + local_bytes(p.grad) for p in learner.weights.params)
    state += sum(local_bytes(p) for p in learner.policy.parameters() if id(p) in compute)  # bfloat16 copies
    state += sum(local_bytes(v) for s in learner.optimizer.state.values() for v in s.values() if v.dim())
    result = {"state_mb": state / 2**20, "peak_mb": sampler.stop(), "step_s": step_s, "publish_mb": 0.0}
    if learner.sharded:
        before = resident_mb()
        sampler = PeakResident()
        sampler.start()
        for _ in learner.weights.buckets(args.bucket_mb << 20):
            pass  # what rank 0 puts in the object store or broadcasts, one bucket at a time
        result["publish_mb"] = sampler.stop() - before
    return result


def run_sharded(args: argparse.Namespace, folder: Path) -> None:
    from grpo_dist.common.net import free_port

    worlds = [int(k) for k in args.ranks.split(",")]
    settings = [("fsdp" if k > 1 else "none", k) for k in worlds] + [("none", max(worlds))]
    print(f"| sharding | ranks | state per rank, MB | vs one rank | target 1/K + 10% | peak RSS per rank, MB "
          f"| step s | publish extra MB (bucket {args.bucket_mb} MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for sharding, world in settings:
        port = free_port()
        commands = [[sys.executable, __file__, "--rank", str(rank), "--world", str(world), "--sharding", sharding,
                     "--port", str(port), "--model", str(folder), "--dtype", args.dtype, "--threads",
                     str(args.threads), "--sequences", str(args.sequences), "--completion-tokens",
                     str(args.completion_tokens), "--bucket-mb", str(args.bucket_mb)] for rank in range(world)]
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for command in commands]
        ranks = [json.loads(proc.communicate()[0].strip().splitlines()[-1]) for proc in procs]
        worst = {key: max(r[key] for r in ranks) for key in ranks[0]}
        base = base or worst
        print(f"| {sharding} | {world} | {worst['state_mb']:.0f} | {worst['state_mb'] / base['state_mb']:.3f} "
              f"| {1 / world + 0.1:.3f} | {worst['peak_mb']:.0f} | {worst['step_s']:.1f} "
              f"| {worst['publish_mb']:.0f} |")


def run_one(args: argparse.Namespace) -> dict[str, float]:
    """One learner step with micro_batch_size `args.one`, in this (fresh) process."""
    group_size = 8
    learner = make_learner(args, group_size, args.one)
    groups = synthetic_groups(args.sequences, args.completion_tokens, group_size)
    before = resident_mb()
    sampler = PeakResident()
    sampler.start()
    metrics = learner.train_step(groups)
    peak = sampler.stop()
    step_mb = metrics["system/learner_peak_memory_mb"] if args.device == "cuda" else peak - before
    return {"step_mb": step_mb, "process_peak_mb": metrics["system/learner_peak_memory_mb"],
            "tokens_per_s": metrics["system/learn_tokens_per_s"]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.one is not None or args.rank is not None:
        print(json.dumps(run_one(args) if args.one is not None else run_rank(args)))
        return
    folder = Path(tempfile.mkdtemp(prefix="learner_memory_"))
    params = build_model(folder)
    print(f"Llama {params / 1e6:.1f}M parameters, {args.dtype}, {args.device}; {args.sequences} sequences of "
          f"{PROMPT_TOKENS} + {args.completion_tokens} tokens; one GRPO step per setting, {args.threads} threads")
    if args.ranks:
        run_sharded(args, folder)
        return
    results = {}
    for size in args.sizes.split(","):
        command = [sys.executable, __file__, "--one", size, "--model", str(folder), "--dtype", args.dtype,
                   "--threads", str(args.threads), "--device", args.device, "--sequences", str(args.sequences),
                   "--completion-tokens", str(args.completion_tokens)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[size] = json.loads(done.stdout.strip().splitlines()[-1])
    base = results.get("null") or next(iter(results.values()))
    print()
    print("| micro_batch_size | step memory, MB | vs whole batch | process peak, MB | tokens/s | vs whole batch |")
    print("|---|---:|---:|---:|---:|---:|")
    for size, r in results.items():
        print(f"| {size} | {r['step_mb']:.0f} | {r['step_mb'] / base['step_mb']:.2f} | {r['process_peak_mb']:.0f} "
              f"| {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f} |")


if __name__ == "__main__":
    main()
