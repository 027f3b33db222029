"""The learner as a plain class, on the built-in tiny Llama and tiny models of other families.

Groups come from a real transformers engine; rewards are non-binary.
"""

import math
import os
import subprocess
import sys

import pytest
import ray
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

from conftest import ENGINES
from learner_helpers import make_config, make_learner, masters, metric_tolerance, scored_groups
from grpo_dist import grpo
from grpo_dist.config.schema import resolve_path
from grpo_dist.learner import state
from grpo_dist.learner.worker import Learner
from grpo_dist.rollout.worker import RolloutWorker
from grpo_dist.weights.checksum import state_checksum

@pytest.fixture(scope="module")
def groups():
    return scored_groups(make_config())


@pytest.mark.parametrize("overrides,passes", [([], 1), (["algo.mu=2", "algo.minibatch_size=8"], 4)])
def test_old_logprobs_are_the_sampling_policy_in_both_paths(groups, overrides, passes):
    learner = make_learner(*overrides)
    metrics = learner.train_step(groups)
    # pi_old (reused from the grad pass, or recomputed) equals the sampler's logprobs
    assert metrics["rollout/logprob_diff_abs_max"] < 1e-4
    if passes == 1:  # the only step runs at pi_old itself: every ratio is exactly 1
        assert metrics["policy/ratio_min"] == metrics["policy/ratio_max"] == 1.0
    else:  # later minibatches and the second pass run on updated weights
        assert metrics["policy/ratio_max"] > 1.0 or metrics["policy/ratio_min"] < 1.0
    assert learner.version == 1 and metrics["policy/version"] == 1.0
    assert 0 < metrics["policy/entropy"] < math.log(17)  # nats; the vocabulary has 17 tokens
    assert metrics["policy/lr"] == 1e-3 and metrics["policy/step_skipped"] == 0.0
    assert metrics["system/learn_tokens_per_s"] > 0 and metrics["system/learner_peak_memory_mb"] > 0
    # where learn_s went: pi_old is a pass of its own only when the batch takes several steps
    stages = {stage: metrics[f"time/learner_{stage}_s"] for stage in ("old_pass", "grad_pass", "optimizer")}
    assert metrics["time/learner_reference_pass_s"] == 0.0  # beta 0: no reference
    assert (stages["old_pass"] > 0) == (passes > 1) and stages["grad_pass"] > 0 and stages["optimizer"] > 0
    assert sum(stages.values()) <= metrics["time/learn_s"]


def test_several_chunks_are_one_batch(groups):
    one, two = make_learner(), make_learner()
    whole, chunked = one.train_step(groups), two.train_step(groups[:1], groups[1:3], groups[3:])
    clock = ("system/", "time/")  # rates and seconds
    assert {k: v for k, v in whole.items() if not k.startswith(clock)} == \
           {k: v for k, v in chunked.items() if not k.startswith(clock)}
    assert one.checksum() == two.checksum()


def test_an_actor_takes_chunks_as_object_refs(ray_cluster, groups):
    """The controller passes several ObjectRefs as top-level arguments; Ray resolves them."""
    config = make_config()
    actor = ray.remote(Learner).options(num_cpus=0.5).remote(config.model, config.algo, config.learner,
                                                              config.rollout, 0)
    metrics = ray.get(actor.train_step.remote(ray.put(groups[:1]), ray.put(groups[1:])))
    local = make_learner()
    assert metrics["loss/total"] == local.train_step(groups)["loss/total"]
    assert ray.get(actor.checksum.remote()) == local.checksum()
    ray.kill(actor)


SPLITS = [["learner.micro_batch_size=1"], ["learner.micro_batch_size=7"],
          ["learner.max_tokens_per_micro_batch=40"]]


@pytest.mark.parametrize("aggregation,ratio_level", [("token_mean", "token"), ("sequence_mean", "token"),
                                                     ("constant", "token"), ("token_mean", "sequence")])
def test_micro_batches_give_the_whole_batch_update(aggregation, ratio_level):
    """Sizes 1, 7, a token budget and null: the same parameters after a step, with beta > 0
    and temperature 0.7, and with two minibatches (pi_old and pi_ref micro-batched too);
    GSPO's sequence ratio too (a micro-batch holds whole rows)."""
    common = [f"algo.aggregation={aggregation}", f"algo.ratio_level={ratio_level}", "algo.beta=0.1",
              "rollout.temperature=0.7", "algo.minibatch_size=8", "algo.mu=2"]
    batch = scored_groups(make_config(*common))
    whole = make_learner(*common, sgd=True)
    expected_metrics = whole.train_step(batch)
    expected = masters(whole)
    for split in SPLITS:
        learner = make_learner(*common, *split, sgd=True)
        metrics = learner.train_step(batch)
        for got, want in zip(masters(learner), expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=lambda m: f"{split}: {m}")
        for key in ("loss/total", "loss/policy", "loss/kl", "policy/entropy", "policy/clip_fraction",
                    "policy/ratio_min", "policy/ratio_mean", "policy/ratio_max"):
            assert metrics[key] == pytest.approx(expected_metrics[key], rel=metric_tolerance(key), abs=1e-6), \
                (split, key)


def test_bfloat16_keeps_float32_masters_and_serves_bfloat16(groups):
    learner = make_learner("model.dtype=bfloat16", "algo.lr=1e-6")
    before = masters(learner)
    served_before = learner.export_weights()
    metrics = learner.train_step(groups)
    assert metrics["policy/step_skipped"] == 0.0 and math.isfinite(metrics["loss/total"])
    after = masters(learner)
    assert all(p.dtype == torch.float32 for p in after)
    assert all(s.dtype == torch.float32 for group in learner.optimizer.state.values()
               for s in group.values() if s.dim() > 0)
    # Adam's first step moves each weight by about lr = 1e-6: far below bfloat16's spacing
    # (~1.2e-4 at 0.02), so the served copy rarely changes, but the masters keep it all
    moved = torch.cat([(a - b).abs().flatten() for a, b in zip(after, before)])
    assert (moved > 0).float().mean() > 0.5 and moved.max() < 2e-6
    served = learner.export_weights()
    assert all(t.dtype == torch.bfloat16 for t in served.values())
    for (name, param), master in zip(learner.policy.named_parameters(), after):
        assert torch.equal(served[name], master.to(torch.bfloat16)), name  # the copy is the rounded master
    assert learner.checksum() == state_checksum(served)
    assert served_before.keys() == served.keys()


def test_bfloat16_learner_computes_like_a_bfloat16_engine(groups):
    """The learner's bf16 model is the one an engine loads with dtype bfloat16, bit for bit."""
    learner = make_learner("model.dtype=bfloat16")
    engine = AutoModelForCausalLM.from_pretrained(resolve_path("builtin:arithmetic/model"), dtype=torch.bfloat16)
    assert learner.checksum() == state_checksum(engine.state_dict())
    metrics = learner.train_step(groups)  # sampled in float32: pi_old differs by bf16 rounding only
    assert metrics["rollout/logprob_diff_abs_mean"] < 0.05


@pytest.mark.parametrize("engine", ENGINES)
def test_both_engines_serve_the_bfloat16_weights_the_learner_exports(engine):
    config = make_config(f"rollout.engine={engine}", "model.dtype=bfloat16", "rollout.vllm.cpu_kv_cache_gb=0.25")
    worker = RolloutWorker(config.model, config.rollout, seed=0)
    learner = Learner(config.model, config.algo, config.learner, config.rollout, seed=0)
    assert worker.checksum() == learner.checksum()  # both loaded the float32 checkpoint as bfloat16
    metrics = learner.train_step(scored_groups(config, worker=worker))
    assert metrics["rollout/logprob_diff_abs_mean"] < 0.01, metrics  # bf16 kernels of two engines
    assert worker.load_weights(learner.export_weights(), version=1) == learner.checksum()
    groups = scored_groups(config, worker=worker, seed=7)  # sampled by the updated weights
    diffs = torch.tensor([abs(a - b) for group, scored in zip(groups, learner.logprobs(groups))
                          for completion, values in zip(group.completions, scored)
                          for a, b in zip(completion.logprobs, values)])
    # bf16 keeps 8 mantissa bits: logits near 10 carry rounding of ~0.04 that the two engines'
    # kernels (vLLM's packed GEMM vs torch) spend differently; measured mean 3e-3..8e-3, max 0.1
    assert diffs.mean() < 0.02 and diffs.max() < 0.3, (diffs.mean(), diffs.max())


def test_a_non_finite_loss_skips_the_step_and_leaves_everything_as_it_was(groups):
    learner = make_learner("algo.beta=0.1")
    before, checksum = masters(learner), learner.checksum()
    poisoned = [group for group in groups]
    poisoned[0] = type(groups[0])(**{**groups[0].__dict__, "rewards": [float("nan"), 1.0, 0.0, 1.0]})
    metrics = learner.train_step(poisoned)
    assert metrics["policy/step_skipped"] == 1.0 and metrics["policy/skipped_steps"] == 1.0
    assert not math.isfinite(metrics["loss/total"])
    assert learner.checksum() == checksum and all(torch.equal(a, b) for a, b in zip(masters(learner), before))
    assert not learner.optimizer.state  # AdamW never stepped: no moments, no step count
    metrics = learner.train_step(groups)  # the next good batch trains as usual
    assert metrics["policy/step_skipped"] == 0.0 and learner.checksum() != checksum
    assert learner.version == 2


def test_the_learner_and_data_load_models_without_the_rollout_package():
    """Model and tokenizer loading is shared (grpo_dist/common/models.py), not borrowed from an engine."""
    code = ("import sys, grpo_dist.learner.worker, grpo_dist.tasks.data; "
            "print(sorted(m for m in sys.modules if m.startswith('grpo_dist.rollout')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"


def completion_logprobs(model: torch.nn.Module, groups, temperature: float) -> list[torch.Tensor]:
    """log softmax(logits / T) of each completion's tokens, one unpadded sequence at a time, in float64."""
    values = []
    with torch.no_grad():
        for group in groups:
            for completion in group.completions:
                ids = torch.tensor([group.prompt_ids + completion.token_ids])
                logits = model(input_ids=ids).logits[0, :-1].double() / temperature
                targets = ids[0, 1:]
                all_logprobs = logits.log_softmax(dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                values.append(all_logprobs[len(group.prompt_ids) - 1 :])
    return values


@pytest.mark.parametrize("lr,beyond_bounds", [("3e-5", False), ("1e-3", True)])
def test_extreme_temperature_kl_after_an_update_matches_an_independent_computation(groups, lr, beyond_bounds):
    """Temperature 0.05 (logits x 20), beta 0.5, micro-batches of 3. The first step runs at
    pi_theta = pi_ref (KL exactly 0); the second at the updated weights, where its KL is the
    token mean of k3 = exp(r) - r - 1, r = log pi_ref - log pi_theta clamped to [-20, 20],
    computed here in float64 from two plain transformers models, one sequence at a time.
    lr 3e-5: every |r| < 20 (measured max 7.8, KL 0.14), k3 as written. lr 1e-3: |r| up to
    266 on 17% of the tokens, where an unclamped exp overflowed and the step was skipped."""
    learner = make_learner("algo.beta=0.5", "rollout.temperature=0.05", "learner.micro_batch_size=3", f"algo.lr={lr}")
    assert learner.train_step(groups)["loss/kl"] == 0.0
    path = resolve_path("builtin:arithmetic/model")
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    policy.load_state_dict(learner.export_weights())  # the weights the second step starts from
    r = torch.cat([ref - theta for ref, theta in zip(completion_logprobs(reference, groups, 0.05),
                                                     completion_logprobs(policy, groups, 0.05))])
    assert bool((r.abs() > 20).any()) == beyond_bounds
    r = r.clamp(-20.0, 20.0)
    expected = (r.exp() - r - 1).mean().item()
    metrics = learner.train_step(groups)
    assert metrics["policy/step_skipped"] == 0.0
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    assert expected > 0.1
    assert metrics["loss/kl"] == pytest.approx(expected, rel=1e-4)  # measured 3e-6 and 2e-7


def test_bfloat16_micro_batches_accumulate_the_whole_batch_update(groups, monkeypatch):
    """bf16 compute copies, float32 masters, micro-batches of 3 (6 of them) against the whole
    batch at once, with beta > 0. SGD without gradient clipping, so the master update is -lr
    times the accumulated gradient itself (AdamW's first step, lr * g / |g|, and clipping to
    max_grad_norm would both hide a wrong scale).

    Tolerance: bf16 keeps 8 significant bits (a rounding of up to 2^-9 = 0.2% per value); the
    two runs compute every activation and gradient in bf16 in differently shaped (padded)
    batches, so their gradients differ by such roundings: measured 0.31% of the update's norm
    (float32: 7e-6). 2% holds that with room and is far below the error of a wrong divisor:
    dividing each micro-batch's loss by its own tokens instead of the whole batch's gives 457%
    (measured below on the same batch)."""
    common = ["model.dtype=bfloat16", "algo.beta=0.1", "algo.max_grad_norm=1e9"]
    start = masters(make_learner(*common, sgd=True))

    def update(*overrides: str) -> torch.Tensor:
        learner = make_learner(*common, *overrides, sgd=True)
        assert learner.train_step(groups)["policy/step_skipped"] == 0.0
        return torch.cat([(after - before).flatten() for after, before in zip(masters(learner), start)])

    def error(got: torch.Tensor, want: torch.Tensor) -> float:
        return ((got - want).norm() / want.norm()).item()

    whole = update()
    assert whole.abs().max() > 0
    assert error(update("learner.micro_batch_size=3"), whole) < 0.02
    policy_loss = grpo.policy_loss_terms  # what the learner calls
    monkeypatch.setattr(grpo, "policy_loss_terms", lambda inputs, settings, denominator:
                        policy_loss(inputs, settings))  # without the whole batch's D: the micro-batch's own
    assert error(update("learner.micro_batch_size=3"), whole) > 1.0


def test_save_then_load_gives_the_same_next_step_bit_for_bit(groups, tmp_path):
    """bf16 masters, two passes of two minibatches (the minibatch generator), beta > 0."""
    overrides = ["model.dtype=bfloat16", "algo.beta=0.1", "algo.mu=2", "algo.minibatch_size=8"]
    later = scored_groups(make_config(*overrides), seed=99)
    original = make_learner(*overrides)
    original.train_step(groups)
    original.save_state(str(tmp_path / "state"))
    expected = original.train_step(later)

    resumed = make_learner(*overrides)
    resumed.load_state(str(tmp_path / "state"))
    assert resumed.version == 1
    metrics = resumed.train_step(later)
    assert all(torch.equal(a, b) for a, b in zip(masters(resumed), masters(original)))
    assert resumed.checksum() == original.checksum()
    assert {k: v for k, v in metrics.items() if not k.startswith(("system/", "time/"))} == \
           {k: v for k, v in expected.items() if not k.startswith(("system/", "time/"))}
    # the policy: a Hugging Face model and tokenizer; float32 masters inside, bfloat16 by default
    policy_dir = tmp_path / "state" / "policy"
    assert AutoModelForCausalLM.from_pretrained(policy_dir).dtype == torch.bfloat16
    assert AutoTokenizer.from_pretrained(policy_dir).pad_token is not None
    with safe_open(policy_dir / "model.safetensors", "pt") as stored:
        assert {stored.get_slice(name).get_dtype() for name in stored.keys()} == {"F32"}


def test_save_replaces_the_folder_atomically_and_a_failed_save_keeps_the_old_one(groups, tmp_path, monkeypatch):
    """The old folder stays whole at the path until the new one is complete: a write that fails
    halfway, or a rename in that fails, leaves it as it was and no hidden sibling behind."""
    learner = make_learner()
    target = tmp_path / "final"
    learner.save(str(target))
    old = (target / "model.safetensors").read_bytes()
    learner.train_step(groups)

    def write_half(weights, tokenizer, directory):
        (directory / "config.json").write_text("{}")
        raise OSError("disk full")

    with monkeypatch.context() as patched:
        patched.setattr(state, "save_policy", write_half)
        with pytest.raises(OSError, match="disk full"):
            learner.save(str(target))
    assert (target / "model.safetensors").read_bytes() == old and os.listdir(tmp_path) == ["final"]

    real_rename = os.rename

    def rename_in_fails(source, destination):
        if destination == target and not os.path.basename(source).startswith(".final.old."):
            raise OSError("rename in failed")
        real_rename(source, destination)

    import grpo_dist.common.atomic

    with monkeypatch.context() as patched:  # where no swap in one step is possible (atomic.exchange): two renames
        patched.setattr(grpo_dist.common.atomic, "exchange", lambda new, target: False)
        patched.setattr(os, "rename", rename_in_fails)
        with pytest.raises(OSError, match="rename in failed"):
            learner.save(str(target))
    assert (target / "model.safetensors").read_bytes() == old and os.listdir(tmp_path) == ["final"]

    assert learner.save(str(target)) == str(target)
    assert os.listdir(tmp_path) == ["final"]
    saved = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).state_dict()
    assert state_checksum(saved) == learner.checksum() and (target / "model.safetensors").read_bytes() != old


def test_the_reference_is_refreshed_every_k_steps_and_resumes(groups, tmp_path):
    """ref_refresh_every=2: pi_ref is model.path's for steps 1-2, the policy of version 2 from step 3
    (the single-step path runs at pi_theta = pi_ref then: KL exactly 0); a checkpoint keeps it."""
    overrides = ["algo.beta=0.1", "algo.ref_refresh_every=2"]
    learner = make_learner(*overrides)
    kls = [learner.train_step(groups)["loss/kl"] for _ in range(2)]
    assert kls[0] == 0.0 and kls[1] > 0
    refreshed = state_checksum(learner.reference.state_dict())
    assert refreshed == learner.checksum()
    learner.save_state(str(tmp_path / "state"))
    assert (tmp_path / "state" / "reference" / "config.json").is_file()
    expected = learner.train_step(groups)
    assert expected["loss/kl"] == 0.0
    resumed = make_learner(*overrides)
    resumed.load_state(str(tmp_path / "state"))
    assert state_checksum(resumed.reference.state_dict()) == refreshed
    assert resumed.train_step(groups)["loss/total"] == expected["loss/total"]


# ---------------------------------------------------------------- other model families

FAMILIES = {
    "llama": None,  # the built-in model (tied embeddings)
    "qwen2_tied": lambda vocab: Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, **SMALL),
    "qwen2_untied": lambda vocab: Qwen2Config(vocab_size=vocab, tie_word_embeddings=False, **SMALL),
    "qwen3": lambda vocab: Qwen3Config(vocab_size=vocab, tie_word_embeddings=False, **SMALL),
    "llama_untied_gqa": lambda vocab: LlamaConfig(vocab_size=vocab, tie_word_embeddings=False, **SMALL),
}
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 64, "bos_token_id": 1,
         "eos_token_id": 1, "pad_token_id": 0}


def family_path(family: str, root) -> str:
    """A tiny model of `family` built from a config, with the built-in task's tokenizer."""
    if FAMILIES[family] is None:
        return "builtin:arithmetic/model"
    tokenizer = AutoTokenizer.from_pretrained(resolve_path("builtin:arithmetic/model"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](len(tokenizer)))
    path = root / family
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradient_checkpointing_gives_the_same_update_for_every_family(family, tmp_path):
    path = family_path(family, tmp_path)
    common = [f"model.path={path}", "algo.beta=0.1", "learner.micro_batch_size=5"]
    batch = scored_groups(make_config(*common))
    plain = make_learner(*common, sgd=True)
    checkpointed = make_learner(*common, "learner.gradient_checkpointing=true", sgd=True)
    assert checkpointed.policy.is_gradient_checkpointing and not plain.policy.is_gradient_checkpointing
    plain_metrics, checkpointed_metrics = plain.train_step(batch), checkpointed.train_step(batch)
    assert checkpointed_metrics["loss/total"] == pytest.approx(plain_metrics["loss/total"], abs=1e-6)
    for a, b in zip(masters(checkpointed), masters(plain)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    bf16 = make_learner(*common, "learner.gradient_checkpointing=true", "model.dtype=bfloat16")
    metrics = bf16.train_step(batch)
    assert metrics["policy/step_skipped"] == 0.0 and math.isfinite(metrics["policy/grad_norm"])
