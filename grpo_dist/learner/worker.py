"""Learner: the trainable policy, the frozen reference, AdamW, and one GRPO update per step.

One `train_step` reads top to bottom like CleanRL's update: batch -> pi_ref and pi_old ->
for each pass and minibatch: this rank's micro-batches -> logprobs -> grpo.policy_loss_terms ->
backward (gradients accumulate) -> sum over ranks -> clip -> AdamW step; then the learning
rate's schedule steps. The pieces live beside it: batch.py (groups to tensors,
micro-batches), logprobs.py, precision.py (float32 masters), lora.py (LoRA adapters),
distributed.py (data-parallel ranks; one rank: no-ops), schedule.py, metrics.py, state.py
(checkpoints), weight_group.py (the NCCL sender). group.py runs several ranks as one learner.
`learn_chunk` and `finish_step` are the same step taken chunk by chunk, as the chunks are scored
(overlap.py: an overlapped sync step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpo_dist import grpo
from grpo_dist.config import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig
from grpo_dist.dtypes import DTYPES
from grpo_dist.learner import sharded_state, state
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.distributed import DataParallel
from grpo_dist.learner.logprobs import batch_logprobs, token_logprobs
from grpo_dist.learner.metrics import StepStats, advantage_metrics, sampler_agreement
from grpo_dist.learner.overlap import ChunkedStep, divide_grads
from grpo_dist.learner.precision import load_policy, load_reference
from grpo_dist.learner.schedule import make_scheduler
from grpo_dist.learner.sharded import ShardedRanks, ShardedWeights, copy_shards, full, shard
from grpo_dist.learner.weight_group import WeightGroup
from grpo_dist.memory import peak_mb, reset_peak
from grpo_dist.models import load_tokenizer
from grpo_dist.types import Group
from grpo_dist.weights import nccl
from grpo_dist.weights.buckets import DEFAULT_BUCKET_BYTES, Bucket, plan_buckets
from grpo_dist.weights.checksum import WireStateDict, export_state_dict, state_checksum


class Learner:
    """Runs as a Ray actor (see controller/actors.py; group.py for several ranks); plain class so that it
    can be used directly. `total_steps` (trainer.steps) is the learning-rate schedule's length."""

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
        self.weight_group = WeightGroup(self.device)
        self.version = 0
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.chunked: ChunkedStep | None = None  # an overlapped step's chunks so far (learn_chunk)

    def _reference(self, model: ModelConfig) -> Callable[..., Any]:
        """pi_ref: model.path's weights in model.dtype, frozen; with LoRA the base, adapter off (no copy)."""
        if self.learner_config.lora is not None:
            from grpo_dist.learner.lora import BasePolicy

            return BasePolicy(self.policy)
        return load_reference(model.path, model.dtype, self.load_device)

    def train_step(self, *chunks: list[Group], max_groups: int | None = None) -> dict[str, float]:
        """One GRPO update on the scored groups of every chunk, the first `max_groups` of them
        when given (dynamic sampling drops the rest); the policy version advances by one.

        A minibatch whose loss or gradient is not finite leaves the weights and AdamW's state
        untouched: `policy/skipped_steps` counts such minibatches, `policy/step_skipped` is 1.
        """
        learn_started, started = time.time(), time.perf_counter()
        reset_peak(self.device)
        groups = [group for chunk in chunks for group in chunk][:max_groups]
        stats = StepStats()
        batch = self._batch(groups, stats)
        # pi_old, the weights that sampled. With one optimizer step per batch it is the grad
        # pass itself, detached (filled in by _update); otherwise it is computed once, first.
        single_step = self._single_step(len(batch))
        self._old_logprobs(batch, not single_step, stats)
        return self._train(batch, groups, stats, single_step, learn_started, started)

    def learn_chunk(self, groups: list[Group], key: str) -> None:
        """Overlap inside a sync step (controller/overlap.py): what can be done on one scored chunk
        while later ones are generated. pi_ref and pi_old always; with one optimizer step per batch
        (mu 1, no minibatches) the gradient pass too, its loss a plain sum (D = 1) that finish_step
        divides by the whole batch's D. `key` names the chunk (its object reference)."""
        began = time.perf_counter()
        if self.chunked is None:
            reset_peak(self.device)
            self.weights.zero_grad()
            self.chunked = ChunkedStep(accumulated=self.algo.mu == 1 and self.algo.minibatch_size is None)
        stats = self.chunked.stats
        batch = self._batch(groups, stats)
        self._old_logprobs(batch, not self.chunked.accumulated, stats)
        if self.chunked.accumulated:
            with stats.timed("grad_pass"):
                self._accumulate(batch, torch.arange(len(batch)), stats, fill_old=True, denominator=1.0)
        self.chunked.add(key, batch, groups, time.perf_counter() - began)

    def finish_step(self, *chunks: list[Group], keys: list[str]) -> dict[str, float]:
        """The end of an overlapped step: train_step's update and metrics on the chunks learn_chunk
        took, the optimizer stepping once on the whole batch's gradient. When those are not the
        chunks `keys` names (one was generated or scored again, or this learner restarted), what
        was taken is dropped and `chunks` are learned afresh, in order, as a calm step learns
        them: the update is the same to the bit (`policy/overlap_fallback` 1)."""
        fallback = self.chunked is None or self.chunked.keys != keys
        if fallback:
            self.chunked = None
            for chunk, key in zip(chunks, keys):
                self.learn_chunk(chunk, key)
        began = time.perf_counter()
        chunked, self.chunked = self.chunked, None
        assert chunked is not None
        batch = TrainBatch.concat(chunked.parts, self.tokenizer.pad_token_id)
        single_step = self._single_step(len(batch))
        if not chunked.accumulated:
            metrics = self._train(batch, chunked.groups, chunked.stats, single_step, chunked.learn_started, began,
                                  chunked.busy_s)
            return {**metrics, "policy/overlap_fallback": float(fallback)}
        self._minibatches(len(batch))  # (one, the whole batch) the generator advances as train_step's does
        denominator = grpo.loss_denominator(batch.mask, self.algo.aggregation, self.rollout.max_new_tokens)
        divide_grads(self.weights.params, denominator)
        chunked.stats.divide_losses(denominator)
        lr = self.optimizer.param_groups[0]["lr"]
        with chunked.stats.timed("optimizer"):
            self._step(chunked.stats)
        metrics = self._end_step(batch, chunked.groups, chunked.stats, single_step, lr, chunked.learn_started,
                                 began, chunked.busy_s)
        return {**metrics, "policy/overlap_fallback": float(fallback)}

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
        if self.sharded:
            copy_shards(self.reference, self.policy)  # sharded alike: shard by shard, rounded to model.dtype
        else:
            self.reference.load_state_dict(self.weights.served_state_dict())

    def logprobs(self, groups: list[Group]) -> list[list[list[float]]]:
        """The learner's logprobs of each completion's tokens, shaped like the groups."""
        if any(c.turns is not None for g in groups for c in g.completions):
            raise ValueError("logprobs() reads one row per completion; a per-turn episode has one per turn")
        values = self._logprobs(self.policy, TrainBatch.from_groups(groups, self.tokenizer.pad_token_id))
        out, row = [], 0
        for group in groups:
            start = len(group.prompt_ids) - 1
            out.append([values[row + i, start : start + len(c.token_ids)].tolist()
                        for i, c in enumerate(group.completions)])
            row += len(group.completions)
        return out

    # ------------------------------------------------------------ weights to the engines

    @property
    def sharded(self) -> bool:
        return isinstance(self.weights, ShardedWeights)

    def export_weights(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[str, torch.Tensor] | list[Any] | None:
        """The weights the engines serve (model.dtype; LoRA: merged); through Ray they land in the object store once.

        Sharded (every rank calls it): gathered a bucket at a time, each put in the object store
        by rank 0 before the next is gathered; rank 0 returns the buckets' ObjectRefs, the others None.
        """
        if not self.sharded:
            return export_state_dict(self.weights.served_state_dict())
        import ray

        refs = []
        for bucket in self.weights.buckets(bucket_bytes):  # a collective: every rank gathers each bucket
            if self.ranks.rank == 0:
                refs.append(ray.put(WireStateDict(bucket)))
        return refs if self.ranks.rank == 0 else None

    def checksum(self) -> str:
        """`state_checksum` of what `export_weights` returns (sharded: every rank calls it)."""
        return self.weights.checksum() if self.sharded else state_checksum(self.weights.served_state_dict())

    def weight_group_address(self) -> tuple[str, int]:
        """Where this node can serve a rendezvous (its IP, a free port): the weight group's, or the ranks'."""
        return WeightGroup.address()

    def join_weight_group(self, host: str, port: int, world_size: int, timeout_s: float,
                          backend: nccl.Backend = "nccl") -> None:
        """Open the weight-update group as rank 0 (nccl on a GPU; gloo is the CPU stand-in)."""
        self.weight_group.join(host, port, world_size, timeout_s, backend)

    def weight_plan(self, bucket_bytes: int) -> list[Bucket]:
        """How `send_weights` packs the state dict; every receiver needs the same plan."""
        return plan_buckets(self.weights.served_names() if self.sharded else self.weights.served_state_dict(),
                            bucket_bytes)

    def send_weights(self, buckets: list[Bucket]) -> None:
        """Broadcast the served weights over the weight group; returns when they have left."""
        if not self.sharded:
            self.weight_group.send(self.weights.served_state_dict(), buckets)
            return
        for bucket in buckets:  # every rank gathers the bucket; rank 0 sends it before the next is gathered
            tensors = self.weights.gather([slot.name for slot in bucket.slots])
            if self.ranks.rank == 0:
                self.weight_group.send(tensors, [bucket])

    def leave_weight_group(self) -> None:
        self.weight_group.leave()

    # ------------------------------------------------------------ data-parallel ranks (group.py)

    def join_ranks(self, host: str, port: int, rank: int, world_size: int) -> None:
        """Become rank `rank` of `world_size` (rank 0 serves the rendezvous at host:port; NCCL on a
        GPU, gloo on the CPU); rank 0's weights are broadcast to every rank. With learner.sharding=fsdp
        the policy (and reference) are sharded instead, and AdamW is built on the shards: every rank
        loaded the same model.path with the same seed (LoRA's initial adapters), so the shards fit
        together (tested: the group's first checksum is one learner's)."""
        if self.learner_config.sharding == "none":
            self.ranks = DataParallel.join(host, port, rank, world_size, self.device,
                                            self.learner_config.collective_timeout_s)
            self.ranks.broadcast(self.weights.params)
            self.weights.update_compute_copies()
        else:
            self.ranks = ShardedRanks.join(host, port, rank, world_size, self.device,
                                            self.learner_config.collective_timeout_s)
            self.weights = ShardedWeights(self.policy, self.dtype, self.learner_config.offload,
                                          getattr(self.weights, "layers", None))
            if isinstance(self.reference, torch.nn.Module):  # LoRA's reference is the policy itself
                shard(self.reference, None, self.learner_config.offload, inference=True)
            self.optimizer = torch.optim.AdamW(self.weights.params, lr=self.algo.lr,
                                               weight_decay=self.algo.weight_decay)
            self.scheduler = make_scheduler(self.optimizer, self.algo, self.total_steps)

    # ------------------------------------------------------------ saving

    def save_state(self, directory: str) -> None:
        """The learner's share of a checkpoint (learner/state.py); the caller makes it atomic."""
        counters = {"version": self.version, "optimizer_steps": self.optimizer_steps,
                    "skipped_steps": self.skipped_steps}
        refreshed = self.reference if self.algo.ref_refresh_every is not None else None
        if self.sharded:  # every rank writes its shards
            sharded_state.save_state(Path(directory), self.weights, self.tokenizer, self.optimizer, self.scheduler,
                                     refreshed, self.generator, counters, self.ranks.rank)
            return
        state.save_state(Path(directory), self.weights, self.tokenizer, self.optimizer, self.scheduler, refreshed,
                         self.generator, counters)

    def load_state(self, directory: str) -> int:
        """Continue from `save_state`'s directory, in a learner built from the same config; returns
        the policy version restored."""
        refreshed = self.reference if self.algo.ref_refresh_every is not None else None
        counters = (sharded_state if self.sharded else state).load_state(
            Path(directory), self.weights, self.optimizer, self.scheduler, refreshed, self.generator)
        self.version = counters["version"]
        self.optimizer_steps, self.skipped_steps = counters["optimizer_steps"], counters["skipped_steps"]
        return self.version

    def write_probe(self, path: str, text: str) -> None:
        """Write `text` to `path` (checkpoint.check_shared_storage: can the driver read it?)."""
        Path(path).write_text(text)

    def save(self, path: str) -> str:
        """Write the policy (float32 masters; LoRA: merged, and the adapter) and tokenizer to `path`,
        replacing a folder there atomically (`state.write_policy`)."""
        if self.sharded:  # every rank gathers, rank 0 writes
            return str(sharded_state.write_policy(self.weights, self.tokenizer, Path(path), self.ranks.rank))
        return str(state.write_policy(self.weights, self.tokenizer, Path(path)))
