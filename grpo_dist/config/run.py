"""How a run executes: the controller's loop (trainer.*), the cluster (cluster.*), the vLLM
engine (rollout.vllm.*), the learner's ranks and memory (learner.*), and what each actor
reserves (the resource fields and bundle check of the rollout, reward and learner sections);
and Section, the strict base of every section.

schema.py composes these into `Config`; import that from there.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    """Unknown keys are errors, so a typo never silently falls back to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class VLLMConfig(Section):
    """vLLM engine settings (used when the rollout engine is vllm); the dtype is model.dtype."""

    max_model_len: int | None = Field(None, ge=1, description="context length; null: the model's own")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory for weights and KV")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (1 on the CPU)")
    enforce_eager: bool = Field(True, description="no CUDA graphs: faster start, slower decoding")
    seed: int | None = Field(None, description="engine seed; null: trainer.seed*1000 + worker index")
    cpu_kv_cache_gb: float = Field(1.0, gt=0, description="KV cache size on the CPU backend, GiB")


Strategy = Literal["pack", "spread"]


def resources_field(actor: str) -> Any:
    return Field(default_factory=dict, description=f"custom Ray resources each {actor} reserves, e.g. "
                 "{engine_node: 1}: it lands only on nodes started with them (ray start --resources)")


def node_labels_field(actor: str) -> Any:
    return Field(default_factory=dict, description=f"node labels each {actor} requires, e.g. "
                 "{pool: gpu}: it lands only on nodes started with them (ray start --labels)")


def check_bundle(section: str, num_cpus: float, num_gpus: float, resources: dict[str, float], what: str) -> None:
    """Every actor sits in a placement-group bundle, and Ray refuses a bundle that asks for nothing."""
    if num_cpus == 0 and num_gpus == 0 and not any(resources.values()):
        raise ValueError(f"{what} sits in a placement-group bundle: give {section}.num_cpus, {section}.num_gpus "
                         f"or {section}.resources > 0")


class TrainerConfig(Section):
    steps: int = Field(150, ge=1)
    max_wall_seconds: float | None = Field(None, gt=0, description="stop training when this much time has passed")
    seed: int = Field(0, description="data order, sampling and learner seeds derive from it")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: every batch is sampled by the weights it trains (async with max_staleness 0); "
        "async: rollouts run ahead of the learner by up to max_staleness versions"
    )
    max_staleness: int = Field(
        1, ge=0, description="async: a sample is trained on at most this many policy versions after the weights "
        "that sampled it; max_staleness+1 batches are in flight"
    )
    overlap_learning: Literal["auto", "on", "off"] = Field(
        "auto", description="sync: the learner starts on a batch's first scored chunks (pi_ref, pi_old and, with "
        "mu 1 and no minibatches, the gradient pass) while later ones are generated; it still steps once, after "
        "the last, on the same gradient (docs/speed.md). on: refused with async max_staleness > 0, "
        "algo.dynamic_sampling or learner.num_ranks > 1; auto: on where it can run and the learner has a GPU or "
        "learner.threads=1 (a CPU learner's threads would take the cores generation needs)"
    )
    call_timeout_s: float = Field(
        600.0, gt=0, description="bound on every wait for an actor call (generate, score, train_step, weight "
        "load); past it a rollout or reward actor counts as hung: it is killed, Ray restarts it and its calls "
        "are sent again (rollout/hangs, reward/hangs); a learner's ends the run, naming the stage"
    )
    eval_every: int = Field(10, ge=0, description="evaluate every N steps (0: before and after only)")
    output_dir: str = Field("runs", description="run directories are created here")
    run_name: str | None = Field(None, description="the run directory's name; null: the start time")
    save_final: bool = Field(True, description="save the final policy to RUN_DIR/final (atomically)")
    checkpoint_every: int = Field(
        50, ge=0, description="save a resumable checkpoint every N steps, and always after the last step and on "
        "SIGINT/SIGTERM (0: only then); --resume continues from the newest"
    )
    keep_checkpoints: int = Field(2, ge=1, description="keep the newest N checkpoints in RUN_DIR/checkpoints")
    max_bad_steps: int = Field(
        3, ge=1, description="stop the run (exit 1, after a checkpoint) after N steps in a row that trained on "
        "nothing: a loss or gradient that was not finite (each skipped, the weights stay the last good ones), or "
        "every sample failed (every episode, or one reward function on every completion; the first error is told)"
    )
    verify_weight_sync: bool = Field(True, description="check every rollout worker's weight checksum each step")
    weight_sync: Literal["auto", "object_store", "nccl"] = Field(
        "auto", description="how weights reach the engines; auto: nccl with engine vllm and whole GPUs, else object_store"
    )
    weight_sync_timeout_s: float = Field(
        300.0, gt=0, description="bound on forming the NCCL weight group, on each NCCL broadcast and on a "
        "resume's push; a step's load through the object store is an actor call (trainer.call_timeout_s)"
    )
    weight_sync_bucket_mb: int = Field(512, ge=1, description="NCCL broadcast bucket size, MiB")
    progress: bool = Field(True, description="a progress bar; false: a console line every 10 steps")
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        ["jsonl", "tensorboard"],
        description="metric sinks: jsonl (RUN_DIR/metrics.jsonl, always written), tensorboard (RUN_DIR/tensorboard), "
        "wandb (needs the wandb package; WANDB_MODE=offline needs no network)",
    )
    wandb_project: str = Field("grpo_dist", description="wandb project; the wandb run is named after the run directory")
    samples_every: int = Field(
        10, ge=0, description="log prompts with their completions, rewards and advantages every N steps (0: never)"
    )
    samples_per_log: int = Field(2, ge=1, description="prompts per samples log, each with all its completions")

    @field_validator("overlap_learning", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        """YAML reads on and off as booleans."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("loggers")
    @classmethod
    def _loggers_installed(cls, value: list[str]) -> list[str]:
        if "wandb" in value and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb is not installed: pip install -e '.[wandb]', or leave wandb out of trainer.loggers")
        return value


class ClusterConfig(Section):
    address: str | None = Field(
        None,
        description="null: join the running cluster (RAY_ADDRESS, else `ray start`'s) if it answers, else start a "
        "local one; 'local': always start one; 'auto', host:port or ray://host:port: join it, fail if it is down",
    )
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a locally started cluster; null: what the "
                                 "run's actors reserve, at least the machine's cores")
    namespace: str = Field("grpo_dist", description="Ray namespace of the run's actors")
    dashboard: bool = Field(False, description="a locally started cluster runs Ray's dashboard and Jobs API "
                            "(seconds of CPU at its start; a cluster that is joined keeps its own)")
    actor_start_timeout_s: float = Field(
        600.0, gt=0, description="give up when actors cannot be placed, or when a restarted actor is not back "
        "within this time"
    )
    max_restarts: int = Field(
        3, ge=0, description="times Ray restarts each rollout and reward actor whose process died; its calls in "
        "flight are sent again, a rollout worker gets the current weights first (docs/checkpoints.md); the learner "
        "is never restarted"
    )


class LoraConfig(Section):
    """LoRA adapters through peft: W x + (alpha / rank) B A x, with B = 0 at the start."""

    rank: int = Field(8, ge=1, description="LoRA rank r")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha; the adapter's output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input in the grad pass "
                           "(> 0 makes pi_old differ from the sampler's policy)")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="module names to adapt (e.g. [q_proj, v_proj]), or all-linear (every linear "
        "layer but the output head)"
    )


class LearnerConfig(Section):
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs of the learner actor (of each rank)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs of the learner actor (of each rank); a fraction shares a "
                            "GPU with rollout workers")
    resources: dict[str, float] = resources_field("learner rank")
    node_labels: dict[str, str] = node_labels_field("learner rank")
    num_ranks: int = Field(
        1, ge=1, description="data-parallel learner ranks: Ray actors in one placement group, each taking its share "
        "of every batch (gloo on CPUs, NCCL on GPUs); rank 0 exports weights"
    )
    collective_timeout_s: float = Field(
        300.0, gt=0, description="with num_ranks > 1: a collective (gradient all-reduce) whose peer rank died or hung "
        "fails after this; the controller hears of a death from Ray within seconds either way"
    )
    sharding: Literal["none", "fsdp"] = Field(
        "none", description="none: every rank holds the whole policy; fsdp: FSDP2 shards parameters, gradients and "
        "AdamW state over the num_ranks ranks (docs/scaling.md)")
    offload: Literal["none", "all"] = Field("none", description="fsdp: all keeps the shards and AdamW on the CPU")
    lora: LoraConfig | None = Field(
        None, description="train LoRA adapters (peft) on a frozen base instead of every weight; null: full training"
    )

    @field_validator("lora")
    @classmethod
    def _peft_installed(cls, value: LoraConfig | None) -> LoraConfig | None:
        if value is not None and importlib.util.find_spec("peft") is None:
            raise ValueError("peft is not installed: pip install -e '.[lora]', or set learner.lora=null")
        return value
    threads: int = Field(2, ge=1, description="torch threads (CPU)")
    micro_batch_size: int | None = Field(
        None, ge=1, description="sequences per forward/backward (gradients accumulate exactly); null: all at once"
    )
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="padded tokens (sequences x longest) per forward/backward; a longer sequence goes alone"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, more time")
    share_prompts: bool = Field(
        True, description="run each distinct prompt of a micro-batch once, its G completions attending to its keys "
        "and values (the same logprobs and gradient up to float rounding, fewer tokens; learner/logprobs.py); "
        "used where it cuts the tokens run by 20% or more; off with gradient_checkpointing or fsdp")

    @model_validator(mode="after")
    def _actor_reserves_resources(self) -> LearnerConfig:
        check_bundle("learner", self.num_cpus, self.num_gpus, self.resources,
                     f"each of the learner.num_ranks={self.num_ranks} learner ranks")
        if self.sharding == "fsdp" and self.num_ranks < 2 or self.offload != "none" and self.sharding != "fsdp":
            raise ValueError(f"learner.sharding=fsdp needs learner.num_ranks >= 2 (got {self.num_ranks}), and "
                             f"learner.offload={self.offload} needs learner.sharding=fsdp (got {self.sharding})")
        return self
