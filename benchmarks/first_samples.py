"""What each sampler draws from the same initial policy: grpo_dist's engines against `model.generate`
as TRL's GRPOTrainer calls it, on the real job's training prompts.

    .venv/bin/python benchmarks/first_samples.py [--prompts 64] [--samplers vllm,transformers,generate]

Step 1 of a GRPO run samples the initial policy, so a sampler that draws from another distribution
(a stray top-k, a repetition penalty from the checkpoint's generation config, a missed EOS, padding
that leaks into attention) shows there before any learning does. Each sampler, in a process of its
own, draws G completions of each of the first `--prompts` training prompts of
configs/smollm2_word_problems.yaml (64 new tokens, the job's temperature) from SmolLM2-135M-Instruct
(scripts/real_model.py). Every completion is scored with the job's reward and with the TRL side's
copy of it (benchmarks/trl_worker.py). The baseline is transformers' `generate` as TRL 1.16 calls
it: each prompt repeated G times in one left-padded batch, `do_sample`, top_p 1, top_k 0, the
tokenizer's EOS. Printed per sampler: the reward rate, the mean length, the fraction cut at the
limit and the mean log-probability of the sampled tokens (the negative of the entropy it
estimates), each with its standard error, and each one's distance from the baseline in standard
errors: samplers of the same distribution differ by about 1 or less.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from typing import Any

from vs_trl import ROOT, real_model_folder

CONFIG = "configs/smollm2_word_problems.yaml"
MAX_NEW_TOKENS = 64
BASELINE = "generate"


def job(model: str, prompts: int) -> tuple[Any, list[Any], str]:
    """The real job's config, its first `prompts` training prompts and its reward's name."""
    from grpo_dist.config.schema import load_config
    from grpo_dist.tasks.data import prepare_data

    config = load_config(CONFIG, [f"model.path={model}", f"rollout.max_new_tokens={MAX_NEW_TOKENS}"])
    (function,) = config.reward.functions
    return config, prepare_data(config).train[:prompts], function.name


def engine_samples(name: str, config: Any, prompts: list[Any]) -> list[tuple[str, list[int], list[float], bool]]:
    """(text, token ids, sampled-token logprobs, cut at the limit) of grpo_dist's engine `name`."""
    from grpo_dist.common.seeding import prompt_seed
    from grpo_dist.rollout.sampling import sampling_settings

    if name == "vllm":
        from grpo_dist.rollout.vllm_engine import VLLMEngine

        vllm = config.rollout.vllm
        engine = VLLMEngine(config.model.path, max_model_len=vllm.max_model_len, cpu_kv_cache_gb=vllm.cpu_kv_cache_gb)
    else:
        from grpo_dist.rollout.hf_engine import HFEngine

        engine = HFEngine(config.model.path)
    sampling, per_call = sampling_settings(config.rollout), config.rollout.prompts_per_step
    samples = []
    for start in range(0, len(prompts), per_call):
        ids = [p.ids for p in prompts[start : start + per_call]]
        groups = engine.generate(ids, sampling, [prompt_seed(0, start, i) for i in range(len(ids))])
        samples += [(c.text, c.token_ids, c.logprobs, c.finish_reason == "length") for g in groups for c in g]
    return samples


def generate_samples(config: Any, prompts: list[Any]) -> list[tuple[str, list[int], list[float], bool]]:
    """The same, from transformers' `generate` called as TRL's GRPOTrainer calls it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(config.model.path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=torch.float32).eval()
    rollout = config.rollout
    generation = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=rollout.temperature,
                                  top_p=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    samples = []
    for start in range(0, len(prompts), rollout.prompts_per_step):
        texts = [p.text for p in prompts[start : start + rollout.prompts_per_step] for _ in range(rollout.group_size)]
        inputs = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**inputs, generation_config=generation, return_dict_in_generate=True,
                                 output_logits=True)
        completions = out.sequences[:, inputs["input_ids"].shape[1]:]
        logprobs = (torch.stack(out.logits, dim=1).float() / rollout.temperature).log_softmax(-1)
        logprobs = logprobs.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
        for row, ids in enumerate(completions.tolist()):
            ended = tokenizer.eos_token_id in ids
            length = ids.index(tokenizer.eos_token_id) + 1 if ended else len(ids)
            samples.append((tokenizer.decode(ids[:length], skip_special_tokens=True), ids[:length],
                            logprobs[row, :length].tolist(), not ended))
    return samples


def mean_and_error(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def measure(name: str, model: str, prompts: int) -> dict[str, tuple[float, float]]:
    """One sampler's statistics over its completions (run in a process of its own)."""
    import torch

    from grpo_dist.reward.registry import load_reward
    from trl_worker import RULES

    torch.set_num_threads(2)
    config, rows, reward_name = job(model, prompts)
    samples = generate_samples(config, rows) if name == BASELINE else engine_samples(name, config, rows)
    ours, theirs = load_reward(reward_name), RULES[reward_name]
    sampled_rows = [rows[i // config.rollout.group_size] for i in range(len(samples))]  # G in a row per prompt
    scored = [(row.text, text, str(row.row[config.data.answer_field]))
              for row, (text, *_) in zip(sampled_rows, samples)]
    return {"completions": (len(samples), 0.0),
            "reward (grpo_dist's rule)": mean_and_error([float(ours(*one)) for one in scored]),
            "reward (TRL side's rule)": mean_and_error([theirs(text, answer) for _, text, answer in scored]),
            "length": mean_and_error([len(ids) for _, ids, _, _ in samples]),
            "cut at the limit": mean_and_error([float(cut) for *_, cut in samples]),
            "mean sampled logprob": mean_and_error([statistics.fmean(lps) for _, _, lps, _ in samples])}


def table(results: dict[str, dict[str, tuple[float, float]]]) -> str:
    """Mean ± SE per sampler, then each sampler's distance from the baseline in standard errors."""
    names = list(results)
    compared = [name for name in names if name != BASELINE] if BASELINE in results else []
    lines = [" | ".join(["", *names, *(f"{name} - {BASELINE}, SEs" for name in compared)]),
             "|".join(["---"] * (1 + len(names) + len(compared)))]
    for row in results[names[0]]:
        cells = [f"{results[name][row][0]:.3f} ± {results[name][row][1]:.3f}" for name in names]
        for name in compared:
            (value, error), (base, base_error) = results[name][row], results[BASELINE][row]
            cells.append(f"{(value - base) / math.hypot(error, base_error):+.2f}" if base_error else "")
        lines.append(" | ".join([row, *cells]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64, help="training prompts, each sampled G=8 times")
    parser.add_argument("--samplers", default="vllm,transformers,generate")
    parser.add_argument("--model", default=None, help="default: scripts/real_model.py's folder")
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)  # one sampler, in this process
    args = parser.parse_args()
    model = real_model_folder(args.model)
    if args.only:
        print(json.dumps(measure(args.only, model, args.prompts)))
        return
    results = {}
    for name in args.samplers.split(","):
        command = [sys.executable, __file__, "--only", name, "--model", model, "--prompts", str(args.prompts)]
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise SystemExit(f"{name} failed:\n{run.stderr[-3000:]}")
        results[name] = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    print(f"SmolLM2-135M-Instruct, {args.prompts} training prompts x G=8, up to {MAX_NEW_TOKENS} tokens (mean ± SE)")
    print(table(results))


if __name__ == "__main__":
    main()
