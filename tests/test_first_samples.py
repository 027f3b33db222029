"""benchmarks/first_samples.py's table: each sampler's distance from the baseline in standard errors."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "first_samples.py"


def load():
    if str(BENCHMARKS) not in sys.path:  # as when run as a script: it imports its neighbour vs_trl
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("first_samples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_gives_each_samplers_distance_from_generate_in_standard_errors():
    results = {"vllm": {"completions": (512, 0.0), "reward": (0.06, 0.012), "length": (58.0, 0.5)},
               "generate": {"completions": (512, 0.0), "reward": (0.04, 0.009), "length": (59.2, 0.5)}}
    lines = load().table(results).splitlines()
    assert lines[0] == " | vllm | generate | vllm - generate, SEs"
    assert lines[2] == "completions | 512.000 ± 0.000 | 512.000 ± 0.000 | "
    assert lines[3] == "reward | 0.060 ± 0.012 | 0.040 ± 0.009 | +1.33"  # 0.02 / hypot(0.012, 0.009) = 0.02 / 0.015
    assert lines[4].endswith(" | -1.70")  # -1.2 / hypot(0.5, 0.5)


def test_without_the_baseline_the_table_has_no_distances():
    lines = load().table({"vllm": {"reward": (0.06, 0.012)}}).splitlines()
    assert lines == [" | vllm", "---|---", "reward | 0.060 ± 0.012"]


def draws(model, prompt: list[int], group_size: int, temperature: float, length: int
          ) -> list[tuple[list[int], list[float]]]:
    """`group_size` completions of `length` tokens drawn from softmax(logits / temperature) by hand,
    each with its tokens' logprobs."""
    import torch

    generator = torch.Generator().manual_seed(len(prompt))
    batch, logprobs = torch.tensor([prompt] * group_size), []
    with torch.no_grad():
        for _ in range(length):
            log_probabilities = (model(batch).logits[:, -1] / temperature).log_softmax(-1)
            drawn = torch.multinomial(log_probabilities.exp(), 1, generator=generator)
            logprobs.append(log_probabilities.gather(1, drawn))
            batch = torch.cat([batch, drawn], dim=1)
    return list(zip(batch[:, len(prompt):].tolist(), torch.cat(logprobs, dim=1).tolist()))


def test_the_model_rows_are_zero_for_draws_from_the_model_and_not_for_a_hotter_sampler(tmp_path):
    """`against_the_model` holds draws to the model that should have made them: exact draws at the
    job's temperature give 0 within the error and report the model's logprobs, draws at 1.3x that
    temperature (more tail, less likely tokens) are many standard errors off on both noisy rows and
    report other logprobs."""
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(12)  # peaked enough that the 10 likeliest tokens do not hold all the mass
    model.save_pretrained(tmp_path)
    group_size, temperature = 8, 0.8
    config = SimpleNamespace(model=SimpleNamespace(path=str(tmp_path)),
                             rollout=SimpleNamespace(group_size=group_size, temperature=temperature))
    rows = [SimpleNamespace(ids=[1 + i, 7 + 2 * i, 3]) for i in range(24)]
    module = load()

    def rows_for(sampling_temperature: float) -> tuple[list[float], float]:
        samples = [(None, ids, logprobs, False) for row in rows
                   for ids, logprobs in draws(model, row.ids, group_size, sampling_temperature, length=12)]
        surprise, tail, served = module.against_the_model(config, rows, samples)
        return [mean / error for mean, error in (module.mean_and_error(surprise), module.mean_and_error(tail))], max(served)

    (right, right_served), (hot, hot_served) = rows_for(temperature), rows_for(1.3 * temperature)
    assert max(abs(z) for z in right) < 4 and right_served < 1e-4, (right, right_served)
    assert hot[0] < -6 and hot[1] > 6 and hot_served > 0.1, (hot, hot_served)
