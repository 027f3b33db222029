"""LoRA (learner.lora) on the built-in tiny Llama: only the adapters train, the engines serve
the merged policy, the reference is the base, checkpoints hold the merged model and the adapter."""

import math

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from conftest import ENGINES
from grpo_dist.config.schema import resolve_path
from grpo_dist.learner.worker import Learner
from grpo_dist.rollout.worker import RolloutWorker
from learner_helpers import make_config, make_learner, scored_groups

LORA = ["learner.lora.rank=4", "learner.lora.alpha=8", "algo.beta=0.1", "learner.micro_batch_size=3"]


def split_parameters(learner: Learner) -> tuple[dict, dict]:
    """(base, adapter) parameters by name, cloned."""
    named = {name: p.detach().clone() for name, p in learner.policy.named_parameters()}
    adapter = {name for name, p in learner.policy.named_parameters() if p.requires_grad}
    return ({n: t for n, t in named.items() if n not in adapter}, {n: t for n, t in named.items() if n in adapter})


@pytest.mark.parametrize("engine", ENGINES)
def test_only_the_adapter_trains_and_the_engine_serves_the_merged_policy(engine):
    """bfloat16 serving with float32 adapters, micro-batches, beta > 0 (the reference is the base)."""
    config = make_config(*LORA, f"rollout.engine={engine}", "model.dtype=bfloat16", "rollout.vllm.cpu_kv_cache_gb=0.25")
    worker = RolloutWorker(config.model, config.rollout, seed=0)
    learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
    assert worker.checksum() == learner.checksum()  # B = 0: the merged policy is the base, bit for bit
    base, adapter = split_parameters(learner)
    assert adapter and all(t.dtype == torch.float32 for t in adapter.values())
    assert all(t.dtype == torch.bfloat16 for t in base.values())

    first = learner.train_step(scored_groups(config, worker=worker))
    assert first["loss/kl"] == 0.0  # pi_theta = pi_ref = the base while B = 0
    second = learner.train_step(scored_groups(config, worker=worker, seed=5))
    assert second["loss/kl"] > 0 and second["policy/step_skipped"] == 0.0
    base_after, adapter_after = split_parameters(learner)
    assert all(torch.equal(base_after[name], tensor) for name, tensor in base.items())
    assert all(not torch.equal(adapter_after[name], tensor) for name, tensor in adapter.items())

    served = learner.export_weights()
    assert worker.load_weights(served, version=2) == learner.checksum()
    # one layer by hand: W' = W + (alpha / r) B A, in float32, rounded to bfloat16 once
    layer = learner.policy.base_model.model.model.layers[0].self_attn.q_proj
    expected = (layer.base_layer.weight.float()
                + (8 / 4) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight).to(torch.bfloat16)
    assert torch.equal(served["model.layers.0.self_attn.q_proj.weight"], expected)
    # what the engine samples with the merged weights, the learner scores alike (bf16 rounding apart)
    groups = scored_groups(config, worker=worker, seed=7)
    diffs = torch.tensor([abs(a - b) for group, scored in zip(groups, learner.logprobs(groups))
                          for completion, values in zip(group.completions, scored)
                          for a, b in zip(completion.logprobs, values)])
    assert diffs.mean() < 0.02 and diffs.max() < 0.3, (diffs.mean(), diffs.max())


def test_saved_policy_is_the_merged_model_and_the_adapter(tmp_path):
    learner = make_learner(*LORA)
    learner.train_step(scored_groups(make_config(*LORA)))
    learner.train_step(scored_groups(make_config(*LORA), seed=3))
    path = learner.save(str(tmp_path / "final"))
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = merged.state_dict()
    assert state.keys() == learner.weights.state_dict().keys()
    assert all(torch.equal(state[name], tensor) for name, tensor in learner.weights.state_dict().items())
    base = AutoModelForCausalLM.from_pretrained(resolve_path("builtin:arithmetic/model"), dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, f"{path}/adapter").eval()
    ids = torch.tensor([[1, 5, 8, 2, 9, 11]])
    with torch.no_grad():
        want = learner.policy(input_ids=ids).logits
        torch.testing.assert_close(adapted(input_ids=ids).logits, want)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_lora_state_resumes_bit_for_bit(tmp_path):
    """Adapter, AdamW over the adapters, and a warmup + cosine schedule."""
    overrides = [*LORA, "algo.lr_schedule=cosine", "algo.warmup_steps=1", "trainer.steps=4",
                 "algo.minibatch_size=8"]
    groups, later = scored_groups(make_config(*overrides)), scored_groups(make_config(*overrides), seed=9)
    original = make_learner(*overrides)
    original.train_step(groups)
    original.train_step(groups)
    original.save_state(str(tmp_path / "state"))
    assert (tmp_path / "state" / "policy" / "adapter" / "adapter_model.safetensors").is_file()
    expected = original.train_step(later)
    resumed = make_learner(*overrides)
    resumed.load_state(str(tmp_path / "state"))
    metrics = resumed.train_step(later)
    assert resumed.checksum() == original.checksum()
    assert {k: v for k, v in metrics.items() if not k.startswith(("system/", "time/"))} == \
           {k: v for k, v in expected.items() if not k.startswith(("system/", "time/"))}
    # step k = 2 of N = 4 after W = 1 warmup step: lr (1 + cos(pi (k - W) / (N - W))) / 2 = 0.75 lr
    assert metrics["policy/lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 3)))
