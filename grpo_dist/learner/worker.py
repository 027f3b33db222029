"""Learner: the trainable policy, the frozen reference, AdamW, and one GRPO update per step.

One `train_step` reads top to bottom like CleanRL's update: batch -> pi_ref and pi_old ->
for each pass and minibatch: micro-batches -> logprobs -> grpo.policy_loss -> backward
(gradients accumulate) -> clip -> AdamW step. The pieces live beside it: batch.py (groups to
tensors, micro-batches), logprobs.py, precision.py (float32 masters), metrics.py, state.py
(checkpoints), weight_group.py (the NCCL sender).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from grpo_dist import grpo
from grpo_dist.config import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig
from grpo_dist.learner import state
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.logprobs import batch_logprobs, token_logprobs
from grpo_dist.learner.metrics import (StepStats, advantage_metrics, peak_memory_mb, reset_peak_memory,
                                       sampler_agreement)
from grpo_dist.learner.precision import load_policy, load_reference
from grpo_dist.learner.weight_group import WeightGroup
from grpo_dist.rollout.hf_engine import load_tokenizer
from grpo_dist.types import Group
from grpo_dist.weights import nccl
from grpo_dist.weights.checksum import export_state_dict, state_checksum


class Learner:
    """Runs as a Ray actor (see trainer.py); plain class so that it can be used directly."""

    def __init__(self, model: ModelConfig, algo: AlgoConfig, learner: LearnerConfig,
                 rollout: RolloutConfig, seed: int) -> None:
        torch.manual_seed(seed)
        torch.set_num_threads(learner.threads)
        self.device = "cuda" if learner.num_gpus > 0 and torch.cuda.is_available() else "cpu"
        self.algo, self.learner, self.rollout = algo, learner, rollout
        self.tokenizer = load_tokenizer(model.path)
        self.weights = load_policy(model.path, model.dtype, self.device, learner.gradient_checkpointing)
        self.policy = self.weights.model  # computes in model.dtype; what the engines serve
        self.reference = load_reference(model.path, model.dtype, self.device) if algo.beta > 0 else None
        self.optimizer = torch.optim.AdamW(self.weights.params, lr=algo.lr, weight_decay=algo.weight_decay)
        self.generator = torch.Generator().manual_seed(seed)  # minibatch order
        self.weight_group = WeightGroup(self.device)
        self.version = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0

    def train_step(self, *chunks: list[Group]) -> dict[str, float]:
        """One GRPO update on the scored groups of every chunk; the policy version advances by one.

        A minibatch whose loss or gradient is not finite leaves the weights and AdamW's state
        untouched: `policy/skipped_steps` counts such minibatches, `policy/step_skipped` is 1.
        """
        started = time.perf_counter()
        reset_peak_memory(self.device)
        groups = [group for chunk in chunks for group in chunk]
        rewards = torch.tensor([reward for group in groups for reward in group.rewards], dtype=torch.float32)
        advantages = grpo.group_advantages(rewards, self.rollout.group_size, scale=self.algo.advantage_scale)
        batch = TrainBatch.from_groups(groups, self.tokenizer.pad_token_id, advantages)
        if self.reference is not None:
            batch.ref_logprobs = self._logprobs(self.reference, batch)
        # pi_old, the weights that sampled. With one optimizer step per batch it is the grad
        # pass itself, detached (filled in by _update); otherwise it is computed once, first.
        single_step = self.algo.mu == 1 and (self.algo.minibatch_size or len(batch)) >= len(batch)
        batch.old_logprobs = torch.zeros_like(batch.mask) if single_step else self._logprobs(self.policy, batch)
        stats = StepStats()
        for _ in range(self.algo.mu):
            for rows in self._minibatches(len(batch)):
                self._update(batch, rows, stats, fill_old=single_step)
        self.version += 1
        tokens = batch.mask.sum().item() * self.algo.mu
        return {
            **stats.metrics(),
            **advantage_metrics(advantages),
            **sampler_agreement(batch.mask, batch.sampler_logprobs, batch.old_logprobs, self.algo.tis_cap),
            "policy/lr": self.optimizer.param_groups[0]["lr"],
            "policy/version": float(self.version),
            "system/learn_tokens_per_s": tokens / (time.perf_counter() - started),
            "system/learner_peak_memory_mb": peak_memory_mb(self.device),
        }

    def _update(self, batch: TrainBatch, rows: torch.Tensor, stats: StepStats, fill_old: bool) -> None:
        """One optimizer step on `rows`, micro-batch by micro-batch; with `fill_old`, each
        micro-batch's logprobs become its pi_old first (so every ratio is 1)."""
        # Every micro-batch's loss is divided by D of all `rows`: their sum is the loss of `rows`.
        denominator = grpo.loss_denominator(batch.mask[rows], self.algo.aggregation, self.rollout.max_new_tokens)
        self.weights.zero_grad()
        for micro_rows in batch.micro_batches(rows, self.learner.micro_batch_size,
                                              self.learner.max_tokens_per_micro_batch):
            micro = batch.select(micro_rows).to(self.device)
            logprobs, entropy = token_logprobs(self.policy, micro.input_ids, micro.attention_mask,
                                               self.rollout.temperature, with_entropy=True)
            if fill_old:
                micro.old_logprobs = torch.where(micro.mask.bool(), logprobs.detach(), 0.0)
                batch.old_logprobs[micro_rows, : logprobs.shape[1]] = micro.old_logprobs.cpu()
            loss, micro_stats = grpo.policy_loss(
                logprobs,
                micro.old_logprobs,
                micro.advantages,
                micro.mask,
                ref_logprobs=micro.ref_logprobs,
                beta=self.algo.beta,
                clip_low=self.algo.clip_low,
                clip_high=self.algo.clip_high,
                aggregation=self.algo.aggregation,
                max_tokens=self.rollout.max_new_tokens,
                sampler_logprobs=micro.sampler_logprobs,
                tis_cap=self.algo.tis_cap,
                denominator=denominator,
            )
            loss.backward()
            self.weights.collect_grads()  # into the float32 master gradients
            stats.add_micro_batch(loss.detach(), micro_stats, entropy, micro.mask)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.weights.params, self.algo.max_grad_norm).item()
        skipped = not (math.isfinite(stats.loss) and math.isfinite(grad_norm))
        if skipped:  # weights and AdamW's moments stay as they were
            self.weights.zero_grad()
            self.skipped_steps += 1
        else:
            self.optimizer.step()
            self.weights.publish()  # masters -> compute copies
            self.optimizer_steps += 1
        stats.end_update(grad_norm, skipped)

    def _minibatches(self, size: int) -> list[torch.Tensor]:
        order = torch.randperm(size, generator=self.generator)
        step = self.algo.minibatch_size or size
        return [order[i : i + step] for i in range(0, size, step)]

    def _logprobs(self, model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
        """A no-grad pass over the whole batch, micro-batched like the grad pass."""
        micro_batches = batch.micro_batches(torch.arange(len(batch)), self.learner.micro_batch_size,
                                            self.learner.max_tokens_per_micro_batch)
        return batch_logprobs(model, batch, micro_batches, self.rollout.temperature, self.device)

    def logprobs(self, groups: list[Group]) -> list[list[list[float]]]:
        """The learner's logprobs of each completion's tokens, shaped like the groups."""
        values = self._logprobs(self.policy, TrainBatch.from_groups(groups, self.tokenizer.pad_token_id))
        out, row = [], 0
        for group in groups:
            start = len(group.prompt_ids) - 1
            out.append([values[row + i, start : start + len(c.token_ids)].tolist()
                        for i, c in enumerate(group.completions)])
            row += len(group.completions)
        return out

    # ------------------------------------------------------------ weights to the engines

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The weights the engines serve (model.dtype); through Ray they land in the object store once."""
        return export_state_dict(self.policy)

    def checksum(self) -> str:
        """`state_checksum` of what `export_weights` returns."""
        return state_checksum(self.policy.state_dict())

    def weight_group_address(self) -> tuple[str, int]:
        return WeightGroup.address()

    def join_weight_group(self, host: str, port: int, world_size: int, timeout_s: float,
                          backend: nccl.Backend = "nccl") -> None:
        """Open the weight-update group as rank 0 (nccl on a GPU; gloo is the CPU stand-in)."""
        self.weight_group.join(host, port, world_size, timeout_s, backend)

    def weight_plan(self, bucket_bytes: int) -> list[nccl.Bucket]:
        """How `send_weights` packs the state dict; every receiver needs the same plan."""
        return nccl.plan_buckets(self.policy.state_dict(), bucket_bytes)

    def send_weights(self, buckets: list[nccl.Bucket]) -> None:
        """Broadcast the served weights over the weight group; returns when they have left."""
        self.weight_group.send(self.policy.state_dict(), buckets)

    def leave_weight_group(self) -> None:
        self.weight_group.leave()

    # ------------------------------------------------------------ saving

    def save_state(self, directory: str) -> None:
        """The learner's share of a checkpoint (learner/state.py); the caller makes it atomic."""
        counters = {"version": self.version, "optimizer_steps": self.optimizer_steps,
                    "skipped_steps": self.skipped_steps}
        state.save_state(Path(directory), self.weights, self.tokenizer, self.optimizer, self.generator, counters)

    def load_state(self, directory: str) -> None:
        """Continue from `save_state`'s directory, in a learner built from the same config."""
        counters = state.load_state(Path(directory), self.weights, self.optimizer, self.generator)
        self.version = counters["version"]
        self.optimizer_steps, self.skipped_steps = counters["optimizer_steps"], counters["skipped_steps"]

    def save(self, path: str) -> str:
        """Write the policy (float32 masters) and tokenizer to `path` atomically (a temporary folder, then rename)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        state.save_policy(self.weights, self.tokenizer, staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        return str(target)
