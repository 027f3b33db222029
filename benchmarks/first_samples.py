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

Two rows hold each sampler to the model itself rather than to another sampler. A float32
transformers forward pass over each completion gives the distribution p_t the sampler should have
drawn token x_t from (logits / temperature). Under a sampler that draws from p_t, at every position
E[log p_t(x_t)] = -H(p_t) and E[1{x_t outside p_t's 10 likeliest}] = p_t(outside them), whatever
the prefix; so the per-token means of `log p_t(x_t) + H(p_t)` ("logprob + entropy") and of
`1{outside} - p_t(outside)` ("tail draws - tail mass") are 0 for a correct sampler, along its own
trajectories, in the batches it really runs. A sampler too hot or one that over-draws the tail
moves them below or above 0 by many standard errors. A third row compares the logprob each sampler
reports for x_t with log p_t(x_t): no noise there, an engine that computes the model's distribution
at every depth of its real batches reports the same numbers to float32 rounding.

`--moved S` asks the same after a weight load, as every step after the first samples: each
engine is built from the model, then takes (`load_weights`, the learner's path) weights moved
from it by S x each tensor's standard deviation x N(0, 1) noise (seed 0), and is held to the
moved model, saved to a folder of its own (`generate` loads that folder: TRL loads nothing).
An engine that kept computing with any part of the old weights moves the two rows off 0.

    .venv/bin/python benchmarks/first_samples.py --moved 0.05 --samplers vllm,transformers
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
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


def moved_model(model: str, scale: float, folder: str) -> dict[str, Any]:
    """`model`'s weights plus scale x each tensor's standard deviation x N(0, 1) (seed 0), saved
    with the tokenizer in `folder`; returns them by Hugging Face name (a tied lm_head too)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    moved = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in moved.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * scale)
    moved.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model).save_pretrained(folder)
    return moved.state_dict()


def engine_samples(name: str, config: Any, prompts: list[Any], weights: dict[str, Any] | None = None
                   ) -> list[tuple[str, list[int], list[float], bool]]:
    """(text, token ids, sampled-token logprobs, cut at the limit) of grpo_dist's engine `name`,
    after it takes `weights` (when given) as it takes a learner's."""
    from grpo_dist.common.seeding import prompt_seed
    from grpo_dist.rollout.sampling import sampling_settings

    if name == "vllm":
        from grpo_dist.rollout.vllm_engine import VLLMEngine

        vllm = config.rollout.vllm
        engine = VLLMEngine(config.model.path, max_model_len=vllm.max_model_len, cpu_kv_cache_gb=vllm.cpu_kv_cache_gb)
    else:
        from grpo_dist.rollout.hf_engine import HFEngine

        engine = HFEngine(config.model.path)
    if weights is not None:
        engine.load_weights(weights)
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


TAIL_RANK = 10  # "the tail": tokens outside p_t's 10 likeliest


def against_the_model(config: Any, rows: list[Any], samples: list[tuple[str, list[int], list[float], bool]]
                      ) -> tuple[list[float], list[float], list[float]]:
    """Per completion, the mean over its tokens of log p_t(x_t) + H(p_t), of 1{x_t in the tail} - p_t(tail)
    and of |the sampler's logprob of x_t - log p_t(x_t)|, p_t from a float32 transformers forward pass of
    prompt + completion at the job's temperature."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(config.model.path, dtype=torch.float32).eval()
    group_size, temperature = config.rollout.group_size, config.rollout.temperature
    surprise, tail, served = [], [], []
    for index, row in enumerate(rows):  # one batch per prompt: its G completions, right-padded
        _, group, given, _ = zip(*samples[index * group_size:(index + 1) * group_size])  # ids, logprobs
        width = max(len(ids) for ids in group)
        batch = torch.tensor([row.ids + ids + [0] * (width - len(ids)) for ids in group])
        with torch.no_grad():
            logits = model(batch).logits[:, len(row.ids) - 1:-1].float() / temperature
        logp = logits.log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        top = logp.topk(TAIL_RANK, dim=-1)
        tail_mass = 1 - top.values.exp().sum(-1)
        for k, ids in enumerate(group):
            tokens = torch.tensor(ids)
            positions = torch.arange(len(ids))
            sampled = logp[k, positions, tokens]
            in_tail = ~(top.indices[k, positions] == tokens[:, None]).any(-1)
            surprise.append((sampled + entropy[k, positions]).mean().item())
            tail.append((in_tail.float() - tail_mass[k, positions]).mean().item())
            served.append((torch.tensor(given[k]) - sampled).abs().mean().item())
    return surprise, tail, served


def mean_and_error(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def measure(name: str, model: str, prompts: int, moved: float = 0.0) -> dict[str, tuple[float, float]]:
    """One sampler's statistics over its completions (run in a process of its own); `moved`: see
    the module's docstring."""
    import torch

    from grpo_dist.reward.registry import load_reward
    from trl_worker import RULES

    torch.set_num_threads(2)
    config, rows, reward_name = job(model, prompts)
    with tempfile.TemporaryDirectory() as folder:
        weights = moved_model(model, moved, folder) if moved else None
        # the model the samples should come from
        held_to = config.model_copy(update={"model": config.model.model_copy(update={"path": folder})}) if moved else config
        if name == BASELINE:
            samples = generate_samples(held_to, rows)
        else:
            samples = engine_samples(name, config, rows, weights)
        surprise, tail, served = against_the_model(held_to, rows, samples)
    ours, theirs = load_reward(reward_name), RULES[reward_name]
    sampled_rows = [rows[i // config.rollout.group_size] for i in range(len(samples))]  # G in a row per prompt
    scored = [(row.text, text, str(row.row[config.data.answer_field]))
              for row, (text, *_) in zip(sampled_rows, samples)]
    return {"completions": (len(samples), 0.0),
            "reward (grpo_dist's rule)": mean_and_error([float(ours(*one)) for one in scored]),
            "reward (TRL side's rule)": mean_and_error([theirs(text, answer) for _, text, answer in scored]),
            "length": mean_and_error([len(ids) for _, ids, _, _ in samples]),
            "cut at the limit": mean_and_error([float(cut) for *_, cut in samples]),
            "mean sampled logprob": mean_and_error([statistics.fmean(lps) for _, _, lps, _ in samples]),
            "logprob + entropy (0 if drawn from the model)": mean_and_error(surprise),
            "tail draws - tail mass (0 if drawn from the model)": mean_and_error(tail),
            "abs(sampler's logprob - the model's), mean per token": mean_and_error(served)}


def number(value: float) -> str:
    """Three decimals, or three significant digits below 0.001 (the served-logprob row)."""
    return f"{value:.2e}" if 0 < abs(value) < 1e-3 else f"{value:.3f}"


def table(results: dict[str, dict[str, tuple[float, float]]]) -> str:
    """Mean ± SE per sampler, then each sampler's distance from the baseline in standard errors."""
    names = list(results)
    compared = [name for name in names if name != BASELINE] if BASELINE in results else []
    lines = [" | ".join(["", *names, *(f"{name} - {BASELINE}, SEs" for name in compared)]),
             "|".join(["---"] * (1 + len(names) + len(compared)))]
    for row in results[names[0]]:
        cells = [f"{number(results[name][row][0])} ± {number(results[name][row][1])}" for name in names]
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
    parser.add_argument("--moved", type=float, default=0.0,
                        help="sample after a load of weights moved by this many standard deviations x noise")
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)  # one sampler, in this process
    args = parser.parse_args()
    model = real_model_folder(args.model)
    if args.only:
        print(json.dumps(measure(args.only, model, args.prompts, args.moved)))
        return
    results = {}
    for name in args.samplers.split(","):
        command = [sys.executable, __file__, "--only", name, "--model", model, "--prompts", str(args.prompts),
                   "--moved", str(args.moved)]
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise SystemExit(f"{name} failed:\n{run.stderr[-3000:]}")
        results[name] = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    after = f", after a load of weights moved by {args.moved} x std x noise" if args.moved else ""
    print(f"SmolLM2-135M-Instruct{after}, {args.prompts} training prompts x G=8, up to {MAX_NEW_TOKENS} tokens"
          " (mean ± SE)")
    print(table(results))


if __name__ == "__main__":
    main()
