"""The update: the trainable policy, the frozen reference, AdamW, and one GRPO update on a batch.

It reads top to bottom like CleanRL's update: batch -> pi_ref and pi_old -> for each pass and
minibatch: this rank's micro-batches -> logprobs -> grpo.policy_loss_terms -> backward
(gradients accumulate) -> sum over ranks -> clip -> AdamW step; then the learning rate's
schedule steps. The pieces live beside it: batch.py (groups to tensors, micro-batches),
logprobs.py, precision.py (float32 masters; the weight strategy), lora.py (LoRA adapters),
distributed.py (data-parallel ranks; one rank: no-ops), schedule.py, metrics.py. The Learner
actor (worker.py) builds on it: its entry points, weights out, ranks and checkpoints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from grpo_dist import grpo
from grpo_dist.config.schema import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig
from grpo_dist.common.dtypes import DTYPES
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.distributed import DataParallel
from grpo_dist.learner.logprobs import batch_logprobs, token_logprobs
from grpo_dist.learner.metrics import StepStats, advantage_metrics, sampler_agreement
from grpo_dist.learner.precision import load_policy, load_reference
from grpo_dist.learner.schedule import make_scheduler
from grpo_dist.learner.sharded import full
from grpo_dist.observe.memory import peak_mb
from grpo_dist.common.models import load_tokenizer
from grpo_dist.common.types import Group


class PolicyUpdate:
    """The learner's model, reference and optimizer, and the update of one step on a batch.
    `total_steps` (trainer.steps) is the learning-rate schedule's length."""

    def __init__(self, model: ModelConfig, algo: AlgoConfig, learner: LearnerConfig,
                 rollout: RolloutConfig, seed: int, total_steps: int | None = None) -> None:
        torch.manual_seed(seed)
        torch.set_num_threads(learner.threads)
        self.device = "cuda" if learner.num_gpus > 0 and torch.cuda.is_available() else "cpu"
        self.algo, self.learner_config, self.rollout = algo, learner, rollout
        self.loss_settings = grpo.LossSettings(
            clip_low=algo.clip_low, clip_high=algo.clip_high, beta=algo.beta, aggregation=algo.aggregation,
            max_tokens=rollout.max_new_tokens, tis_cap=algo.tis_cap, ratio_level=algo.ratio_level)
        self.tokenizer = load_tokenizer(model.path)
        self.dtype, self.total_steps = DTYPES[model.dtype], total_steps
        # fsdp: a float32 policy (LoRA: a float32 base) in host memory, sharded in join_ranks, which
        # moves only this rank's shards to the device; the shards become the masters
        compute, self.load_device = ("float32", "cpu") if learner.sharding == "fsdp" else (model.dtype, self.device)
        self.weights = load_policy(model.path, compute, self.load_device, learner.gradient_checkpointing, learner.lora)
        self.policy = self.weights.model  # computes pi_theta; in model.dtype (LoRA: the adapters in float32)
        # a prompt's keys and values shared by its completions. Not with gradient checkpointing (it runs
        # without a cache) nor fsdp (each forward gathers the shards: every rank must run as many)
        self.share_prompts = (learner.share_prompts and not learner.gradient_checkpointing
                              and learner.sharding != "fsdp")
        self.reference = self._reference(model) if algo.beta > 0 else None
        self.optimizer = torch.optim.AdamW(self.weights.params, lr=algo.lr, weight_decay=algo.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, algo, total_steps)
        self.ranks = DataParallel()  # one rank until join_ranks
        self.generator = torch.Generator().manual_seed(seed)  # minibatch order, the same on every rank
        self.version = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0

    def _reference(self, model: ModelConfig) -> Callable[..., Any]:
        """pi_ref: model.path's weights in model.dtype, frozen; with LoRA the base, adapter off (no copy)."""
        if self.learner_config.lora is not None:
            from grpo_dist.learner.lora import BasePolicy

            return BasePolicy(self.policy)
        return load_reference(model.path, model.dtype, self.load_device)

    def _single_step(self, rows: int) -> bool:
        """Whether a batch of `rows` takes one optimizer step (mu 1, one minibatch)."""
        return self.algo.mu == 1 and (self.algo.minibatch_size or rows) >= rows

    def _batch(self, groups: list[Group], stats: StepStats) -> TrainBatch:
        """The groups as tensors, with their advantages and pi_ref."""
        batch = TrainBatch.from_groups(groups, self.tokenizer.pad_token_id, self._advantages(groups),
                                       self.algo.mask_truncated)
        if self.reference is not None:
            with stats.timed("reference_pass"):
                batch.ref_logprobs = self._shared_logprobs(self.reference, batch)
        return batch

    def _advantages(self, groups: list[Group]) -> torch.Tensor:
        """One per completion, group by group (so any whole groups, a chunk's, give the batch's values)."""
        rewards = torch.tensor([reward for group in groups for reward in group.rewards], dtype=torch.float32)
        return grpo.group_advantages(rewards, self.rollout.group_size, scale=self.algo.advantage_scale)

    def _old_logprobs(self, batch: TrainBatch, computed: bool, stats: StepStats) -> None:
        """pi_old: `computed` first, or zeros for the grad pass to fill in (`fill_old`)."""
        if not computed:
            batch.old_logprobs = torch.zeros_like(batch.mask)
            return
        with stats.timed("old_pass"):
            batch.old_logprobs = self._shared_logprobs(self.policy, batch)

    def _train(self, batch: TrainBatch, groups: list[Group], stats: StepStats, single_step: bool,
               learn_started: float, started: float, busy_s: float = 0.0) -> dict[str, float]:
        """mu passes over the batch, an optimizer step per minibatch, then the step's end."""
        lr = self.optimizer.param_groups[0]["lr"]
        for _ in range(self.algo.mu):
            for rows in self._minibatches(len(batch)):
                self._update(batch, rows, stats, fill_old=single_step)
        return self._end_step(batch, groups, stats, single_step, lr, learn_started, started, busy_s)

    def _end_step(self, batch: TrainBatch, groups: list[Group], stats: StepStats, single_step: bool, lr: float,
                  learn_started: float, started: float, busy_s: float) -> dict[str, float]:
        """After the last optimizer step: the schedule, the version, the metrics. The learner was busy
        `busy_s` (learn_chunk's calls) before `started` (perf_counter) and since."""
        if single_step:
            self.ranks.sum(batch.old_logprobs)  # each rank filled its own rows
        stats.sum_tokens(self.ranks)
        self.scheduler.step()
        self.version += 1
        self._refresh_reference()
        tokens = batch.mask.sum().item() * self.algo.mu
        masked = self.algo.mask_truncated * sum(c.finish_reason == "length" for g in groups for c in g.completions)
        learn_s = busy_s + time.perf_counter() - started
        return {
            **stats.metrics(),
            **advantage_metrics(self._advantages(groups)),
            **sampler_agreement(batch.mask, batch.sampler_logprobs, batch.old_logprobs, self.algo.tis_cap),
            "policy/lr": lr,
            "policy/truncated_masked": float(masked),
            "policy/version": float(self.version),
            "system/learn_tokens_per_s": tokens / learn_s,
            "system/learner_peak_memory_mb": peak_mb(self.device),
            "time/learn_s": learn_s,  # the controller's learner_idle_fraction
            "time/learn_started": learn_started,  # unix seconds: when this step's learning began and ended
            "time/learn_ended": time.time(),
        }

    def _update(self, batch: TrainBatch, rows: torch.Tensor, stats: StepStats, fill_old: bool) -> None:
        """One optimizer step on `rows`, this rank's share of them micro-batch by micro-batch; with
        `fill_old`, each micro-batch's logprobs become its pi_old first (so every ratio is 1)."""
        # Every micro-batch's loss (on every rank) is divided by D of all `rows`: the sum is the loss of `rows`.
        denominator = grpo.loss_denominator(batch.mask[rows], self.algo.aggregation, self.rollout.max_new_tokens)
        self.weights.zero_grad()
        with stats.timed("grad_pass"):
            self._accumulate(batch, rows, stats, fill_old, denominator)
        with stats.timed("optimizer"):
            self._step(stats)

    def _accumulate(self, batch: TrainBatch, rows: torch.Tensor, stats: StepStats, fill_old: bool,
                    denominator: float) -> None:
        """Forward and backward of this rank's share of `rows`, micro-batch by micro-batch, each loss
        divided by `denominator`; the gradients add up in the float32 masters."""
        for micro_rows in self.ranks.pad(batch.micro_batches(self.ranks.shard(rows, batch.lengths),
                                                             self.learner_config.micro_batch_size,
                                                             self.learner_config.max_tokens_per_micro_batch)):
            if micro_rows is None:  # fsdp: an empty micro-batch, so that every rank runs the same collectives
                micro = batch.select(rows[:1]).to(self.device)
                logprobs, _ = token_logprobs(self.policy, micro.input_ids, micro.attention_mask, self.rollout.temperature)
                (logprobs.sum() * 0.0).backward()
                continue
            micro = batch.select(micro_rows).to(self.device)
            logprobs, entropy = token_logprobs(self.policy, micro.input_ids, micro.attention_mask,
                                               self.rollout.temperature, with_entropy=True,
                                               prefix_lengths=micro.prefix_lengths if self.share_prompts else None)
            if fill_old:
                micro.old_logprobs = torch.where(micro.mask.bool(), logprobs.detach(), 0.0)
                batch.old_logprobs[micro_rows, : logprobs.shape[1]] = micro.old_logprobs.cpu()
            inputs = grpo.LossInputs(logprobs, micro.old_logprobs, micro.advantages, micro.mask,
                                     ref_logprobs=micro.ref_logprobs, sampler_logprobs=micro.sampler_logprobs)
            loss, micro_stats = grpo.policy_loss_terms(inputs, self.loss_settings, denominator)
            loss.backward()
            self.weights.collect_grads()  # into the float32 master gradients
            stats.add_micro_batch(loss.detach(), micro_stats, entropy, micro.mask)

    def _step(self, stats: StepStats) -> None:
        """Sum the gradient over ranks, clip it, and step AdamW unless the loss or gradient is not finite."""
        self.ranks.sum_grads(self.weights.params)  # every rank: the gradient of all `rows`
        stats.sum_losses(self.ranks)
        grad_norm = full(torch.nn.utils.clip_grad_norm_(self.weights.params, self.algo.max_grad_norm)).item()
        skipped = not (math.isfinite(stats.loss) and math.isfinite(grad_norm))
        if skipped:  # weights and AdamW's moments stay as they were
            self.weights.zero_grad()
            self.skipped_steps += 1
        else:
            self.optimizer.step()
            self.weights.update_compute_copies()  # masters -> compute copies
            self.optimizer_steps += 1
        stats.end_update(grad_norm, skipped)

    def _minibatches(self, size: int) -> list[torch.Tensor]:
        order = torch.randperm(size, generator=self.generator)
        step = self.algo.minibatch_size or size
        return [order[i : i + step] for i in range(0, size, step)]

    def _logprobs(self, model: Callable[..., Any], batch: TrainBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """A no-grad pass over `rows` (all by default), micro-batched like the grad pass; 0 elsewhere."""
        rows = torch.arange(len(batch)) if rows is None else rows
        micro_batches = self.ranks.pad(batch.micro_batches(rows, self.learner_config.micro_batch_size,
                                                           self.learner_config.max_tokens_per_micro_batch))
        return batch_logprobs(model, batch, micro_batches, self.rollout.temperature, self.device, self.share_prompts)

    def _shared_logprobs(self, model: Callable[..., Any], batch: TrainBatch) -> torch.Tensor:
        """`_logprobs` of the whole batch, each rank computing its share (the sum over ranks is the whole)."""
        return self.ranks.sum(self._logprobs(model, batch, self.ranks.shard(torch.arange(len(batch)), batch.lengths)))

    def _refresh_reference(self) -> None:
        """Every algo.ref_refresh_every versions pi_ref becomes the policy: the served weights, copied."""
        every = self.algo.ref_refresh_every
        if every is None or self.version % every:
            return
        self.weights.refresh_reference(self.reference)

