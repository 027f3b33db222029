"""The transformers engine's own sampling loop against `model.generate`, on the default task.

    python benchmarks/hf_sampler.py [--steps 10] [--threads 2]

Both sample the same batch (a step's prompts x group_size completions, the default task's
model and settings) from the same weights; the baseline is the engine as it was before it
had a loop of its own: one `model.generate` call, one random stream for the whole call.
Prints the median generation seconds per step of each, interleaved so that machine noise
falls on both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import prepare_data
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.rollout.sampling import sampling_settings
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings


@torch.no_grad()
def model_generate(engine: HFEngine, prompt_ids: list[list[int]], sampling: SamplingSettings, seed: int) -> int:
    """The baseline: transformers' generate with num_return_sequences; returns the tokens sampled."""
    torch.manual_seed(seed)
    input_ids, attention_mask = engine._left_padded(prompt_ids)
    out = engine.model.generate(
        input_ids=input_ids, attention_mask=attention_mask, do_sample=True, temperature=sampling.temperature,
        top_p=sampling.top_p, top_k=0, max_new_tokens=sampling.max_new_tokens, num_return_sequences=sampling.n,
        pad_token_id=engine.tokenizer.pad_token_id, eos_token_id=engine.tokenizer.eos_token_id,
        output_scores=True, return_dict_in_generate=True,  # scores: what the old engine's logprobs came from
    )
    return int((out.sequences[:, input_ids.shape[1]:] != engine.tokenizer.pad_token_id).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(None)
    prompts = prepare_data(config).train
    sampling = sampling_settings(config.rollout)
    batch = config.rollout.prompts_per_step
    engine = HFEngine(config.model.path, config.model.dtype)
    times: dict[str, list[float]] = {"own loop (per-completion streams)": [], "model.generate (baseline)": []}
    tokens: dict[str, int] = dict.fromkeys(times, 0)
    for step in range(args.steps + 1):  # step 0 warms up
        ids = [p.ids for p in prompts[step * batch : (step + 1) * batch]]
        for name in times:
            clock = time.perf_counter()
            if name.startswith("own"):
                groups = engine.generate(ids, sampling, [prompt_seed(0, step, i) for i in range(len(ids))])
                sampled = sum(len(c.token_ids) for g in groups for c in g)
            else:
                sampled = model_generate(engine, ids, sampling, step)
            if step:
                times[name].append(time.perf_counter() - clock)
                tokens[name] += sampled
    print(f"default task: {batch} prompts x {sampling.n} completions, max_new_tokens {sampling.max_new_tokens}, "
          f"{args.threads} threads, median of {args.steps} steps")
    print(f"{'sampler':36} {'s/step':>8} {'tokens/step':>12}")
    for name, values in times.items():
        print(f"{name:36} {statistics.median(values):8.3f} {tokens[name] / args.steps:12.1f}")


if __name__ == "__main__":
    main()
