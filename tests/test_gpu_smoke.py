"""deploy/gpu_smoke.py as far as a CPU allows: arguments, the Qwen2 model and tokenizer it builds,
and the real TrainingRun it drives (on the CPU, tiny model, transformers engine).

The GPU run itself (vLLM on CUDA, NCCL sync) is not exercised here.
"""

import gc
import importlib.util
from pathlib import Path

import pytest

from grpo_dist.config.schema import vllm_installed
from grpo_dist.common.types import SamplingSettings

SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "gpu_smoke.py"


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments_default_to_the_half_billion_model(smoke):
    args = smoke.parse_args([])
    assert args.size == "0.5b" and args.sync == "auto" and not args.dry_run
    assert smoke.parse_args(["--size", "tiny", "--steps", "2", "--sync", "nccl"]).steps == 2


def test_dry_run_builds_the_tiny_model_and_plans_buckets(smoke, capsys):
    smoke.main(["--dry-run", "--size", "tiny", "--bucket-mb", "1"])
    out = capsys.readouterr().out
    assert "Qwen2 tiny" in out and "NCCL buckets" in out


@pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")
def test_the_built_model_and_tokenizer_run_in_vllm(smoke, tmp_path):
    from grpo_dist.rollout.vllm_engine import VLLMEngine

    smoke.save_model("tiny", tmp_path)
    engine = VLLMEngine(str(tmp_path), dtype="float32", max_model_len=128, cpu_kv_cache_gb=0.25)
    tokenizer = smoke.build_tokenizer()
    [group] = engine.generate([tokenizer("12+7=")["input_ids"]], SamplingSettings(n=4, max_new_tokens=8), [0])
    assert len(group) == 4 and all(len(c.logprobs) == len(c.token_ids) > 0 for c in group)
    assert all(tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text for c in group)
    del engine
    gc.collect()  # tear vLLM's process-wide state down now, not under a later test's engine


@pytest.mark.slow
def test_the_smoke_run_drives_the_trainer_on_the_cpu(smoke, tmp_path, capsys):
    summary = smoke.main(["--size", "tiny", "--engine", "transformers", "--mode", "async", "--steps", "2",
                          "--prompts", "8", "--group-size", "4", "--max-new-tokens", "8",
                          "--output-dir", str(tmp_path)])
    assert summary["steps"] == 2 and summary["mode"] == "async" and summary["rollout_engine"] == "transformers"
    out = capsys.readouterr().out
    assert "0 GPU(s); engine transformers; weight sync object_store; mode async" in out and "gen tok/s" in out
