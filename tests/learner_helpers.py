"""Learners and scored groups for the tests that train a learner directly (no Ray):
test_learner, test_learner_group, test_lora, test_schedule, test_algorithms, test_dynamic."""

from contextlib import contextmanager

import ray
import torch

from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import build_prompts
from grpo_dist.controller.actor_classes import start_learner
from grpo_dist.learner.schedule import make_scheduler
from grpo_dist.learner.worker import Learner
from grpo_dist.common.models import load_tokenizer
from grpo_dist.reward.rules import exact_answer
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.common.types import SamplingSettings

BASE = ["rollout.engine=transformers", "rollout.group_size=4", "rollout.threads=1", "learner.threads=1",
        "algo.lr=1e-3"]
PROBLEMS = [(58, 67), (12, 30), (99, 1), (45, 45)]


def make_config(*overrides: str):
    return load_config(None, [*BASE, *overrides])


def make_learner(*overrides: str, sgd: bool = False) -> Learner:
    """With `sgd`, plain SGD (lr 0.1) replaces AdamW, so that parameters show the gradient itself:
    AdamW's first step, lr * g / (|g| + eps), turns float noise in a gradient near 0 (1e-7
    here, between equal updates computed in different orders) into differences of up to lr."""
    config = make_config(*overrides)
    learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0,
                      total_steps=config.trainer.steps)
    if sgd:
        learner.optimizer = torch.optim.SGD(learner.weights.params, lr=0.1)
        learner.scheduler = make_scheduler(learner.optimizer, config.algo, config.trainer.steps)
    return learner


def scored_groups(config, problems=PROBLEMS, seed=1234, worker=None):
    """Groups sampled by a real engine; reward = exact answer + 0.1 per token (non-binary)."""
    worker = worker or RolloutWorker(config.model, config.rollout, seed=0)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in problems]
    prompts = build_prompts(rows, config.data, load_tokenizer(config.model.path))
    sampling = SamplingSettings(n=config.rollout.group_size, temperature=config.rollout.temperature,
                                max_new_tokens=config.rollout.max_new_tokens)
    groups = worker.generate(prompts, sampling, [prompt_seed(seed, 0, i) for i in range(len(prompts))])
    for group in groups:
        group.rewards = [exact_answer(group.prompt, c.text, group.row["answer"]) + 0.1 * len(c.token_ids)
                         for c in group.completions]
    return groups


def masters(learner: Learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.weights.params]


def metric_tolerance(key: str) -> float:
    """Relative tolerance between one step's metrics computed over other batch shapes.

    k3 = pi_ref / pi - log(pi_ref / pi) - 1 is exponential in the log-ratio. With mu 2 and
    the SGD of `make_learner(sgd=True)` (lr 0.1), the second minibatch can hold a token whose
    probability the first update cut 3e-6-fold, whose KL (about 3e5) is most of the batch's:
    other batch shapes' rounding then moved loss/kl by 2.2e-4 of itself (measured: micro_batch_size
    1 against none), and the gradient norm (1.2e5, the same token's r - 1) by 1.1e-4, while the
    (clipped) weights stayed within 1e-6. Every other metric: 1e-4.
    """
    return 1e-3 if key in ("loss/total", "loss/kl", "policy/grad_norm") else 1e-4


@contextmanager
def learner_group(overrides, ranks):
    """A started LearnerGroup of `ranks` ranks, closed and killed however the block ends: a
    failed assertion must not leave its ranks holding the module cluster's CPUs (the next test's
    ranks would wait for them until call_timeout_s)."""
    group = start_learner(make_config(*overrides, f"learner.num_ranks={ranks}"))
    try:
        yield group
    finally:
        try:
            ray.get(group.close.remote(), timeout=60)
        finally:
            ray.kill(group)
