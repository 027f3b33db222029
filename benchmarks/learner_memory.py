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

from grpo_dist.memory import resident_mb

PROMPT_TOKENS = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="null,4,2,1", help="micro_batch_size values; null = whole batch")
    parser.add_argument("--sequences", type=int, default=8, help="sequences in the batch (groups of 8)")
    parser.add_argument("--completion-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setting, print JSON
    parser.add_argument("--model", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build_model(folder: Path) -> int:
    """A ~35M-parameter Llama with the built-in task's tokenizer (token ids are synthetic)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from grpo_dist.config import resolve_path

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
    from grpo_dist.types import Completion, Group

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


def run_one(args: argparse.Namespace) -> dict[str, float]:
    """One learner step with micro_batch_size `args.one`, in this (fresh) process."""
    from grpo_dist.config import load_config
    from grpo_dist.learner.worker import Learner

    group_size = 8
    config = load_config(None, [
        f"model.path={args.model}", f"model.dtype={args.dtype}", f"learner.threads={args.threads}",
        f"learner.micro_batch_size={args.one}", f"learner.num_gpus={int(args.device == 'cuda')}",
        f"rollout.group_size={group_size}", f"rollout.prompts_per_step={args.sequences // group_size}",
        f"rollout.max_new_tokens={args.completion_tokens}", "algo.lr=1e-5",
    ])
    learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
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
    if args.one is not None:
        print(json.dumps(run_one(args)))
        return
    folder = Path(tempfile.mkdtemp(prefix="learner_memory_"))
    params = build_model(folder)
    print(f"Llama {params / 1e6:.1f}M parameters, {args.dtype}, {args.device}; {args.sequences} sequences of "
          f"{PROMPT_TOKENS} + {args.completion_tokens} tokens; one GRPO step per setting, {args.threads} threads")
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
