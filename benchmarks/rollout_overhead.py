"""What grpo_dist's rollout path costs over calling vLLM directly.

    python benchmarks/rollout_overhead.py [--prompts 256 --n 8 --max-new-tokens 8 --repeats 5]

The same prompts (token ids) and sampling parameters go, in one invocation, through
  grpo_dist:  a RolloutWorker Ray actor (engine=vllm), called from this driver: tokenizing,
              generating, converting to Groups and shipping them back through Ray;
  direct:     vllm.LLM.generate in this process, with the engine settings VLLMEngine uses.
Repeats alternate between the two so that load from other work hits both alike; the
table reports the median completion tokens/s of each and their ratio (target >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ray
import torch

from grpo_dist.config.schema import RolloutConfig, load_config
from grpo_dist.tasks.data import build_prompts, read_jsonl
from grpo_dist.common.models import load_tokenizer
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.common.types import SamplingSettings


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of either engine")
    return parser.parse_args()


def direct_llm(model_path: str, dtype: str, rollout: RolloutConfig):
    """vllm.LLM built as VLLMEngine builds it on the CPU (in process, same KV cache, eager)."""
    from vllm import LLM

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return LLM(model_path, dtype=dtype, seed=0, enforce_eager=rollout.vllm.enforce_eager,
               max_model_len=rollout.vllm.max_model_len, distributed_executor_backend="uni",
               kv_cache_memory_bytes=int(rollout.vllm.cpu_kv_cache_gb * (1 << 30)),
               logprobs_mode="processed_logprobs")


def main() -> None:
    args = parse_args()
    config = load_config(None, ["rollout.engine=vllm", f"rollout.threads={args.threads}", "rollout.num_cpus=1",
                                "rollout.vllm.cpu_kv_cache_gb=0.5"])
    rows = read_jsonl(config.data.train)[: args.prompts]
    prompts = build_prompts(rows, config.data, load_tokenizer(config.model.path))
    prompt_ids = [p.ids for p in prompts]
    seeds = list(range(len(prompts)))
    sampling = SamplingSettings(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    worker = ray.remote(RolloutWorker).options(num_cpus=1).remote(config.model, config.rollout, 0)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from grpo_dist.config.schema import resolve_path

    torch.set_num_threads(args.threads)
    llm = direct_llm(resolve_path(config.model.path), config.model.dtype, config.rollout)
    # VLLMEngine's parameters: sampled-token logprobs, no detokenizing (grpo_dist decodes the
    # ids itself, and that time is counted on its side)
    params = SamplingParams(n=args.n, temperature=args.temperature, max_tokens=args.max_new_tokens, seed=0,
                            logprobs=0, detokenize=False)
    token_prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]

    def run_grpo_dist() -> int:
        groups = ray.get(worker.generate.remote(prompts, sampling, seeds))
        return sum(len(c.token_ids) for g in groups for c in g.completions)

    def run_direct() -> int:
        outputs = llm.generate(token_prompts, params, use_tqdm=False)
        return sum(len(c.token_ids) for out in outputs for c in out.outputs)

    rates: dict[str, list[float]] = {"grpo_dist RolloutWorker (Ray actor)": [], "vllm.LLM.generate (direct)": []}
    runs = dict(zip(rates, (run_grpo_dist, run_direct)))
    for name, run in runs.items():  # warm-up, untimed
        run()
    for _ in range(args.repeats):
        for name, run in runs.items():
            clock = time.perf_counter()
            tokens = run()
            rates[name].append(tokens / (time.perf_counter() - clock))

    medians = {name: statistics.median(values) for name, values in rates.items()}
    grpo, direct = medians.values()
    print(f"\n{args.prompts} prompts x n={args.n}, max {args.max_new_tokens} new tokens, "
          f"temperature {args.temperature}, {args.threads} threads, median of {args.repeats}")
    print("| path | completion tokens/s (median) | min | max |\n|---|---:|---:|---:|")
    for name, values in rates.items():
        print(f"| {name} | {medians[name]:.0f} | {min(values):.0f} | {max(values):.0f} |")
    print(f"| ratio grpo_dist / direct | {grpo / direct:.2f} | | |")
    ray.shutdown()


if __name__ == "__main__":
    main()
