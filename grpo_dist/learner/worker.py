"""Learner: the actor around the update (update.py): its entry points, weights out, ranks, checkpoints.

`train_step` takes one GRPO update on a batch; `learn_chunk` and `finish_step` are the same step
taken chunk by chunk, as the chunks are scored (overlap.py: an overlapped sync step), and
train_step is them on the batch as one chunk. Weights leave through the weight strategy
(precision.PolicyWeights: export.py, the NCCL sender too), which also writes checkpoints
(state.py; sharded_state.py). group.py runs several ranks as one learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpo_dist import grpo
from grpo_dist.config.schema import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.distributed import DataParallel
from grpo_dist.learner.export import WeightGroup
from grpo_dist.learner.overlap import ChunkedStep, divide_grads
from grpo_dist.learner.schedule import make_scheduler
from grpo_dist.learner.sharded import ShardedRanks, ShardedWeights, shard
from grpo_dist.learner.update import PolicyUpdate
from grpo_dist.observe.memory import reset_peak
from grpo_dist.common.types import Group
from grpo_dist.weights import nccl
from grpo_dist.weights.buckets import DEFAULT_BUCKET_BYTES, Bucket


WHOLE_BATCH = "train_step"  # the key of train_step's one chunk


class Learner(PolicyUpdate):
    """Runs as a Ray actor (see controller/actors.py; group.py for several ranks); plain class so that it
    can be used directly. `total_steps` (trainer.steps) is the learning-rate schedule's length."""

    def __init__(self, model: ModelConfig, algo: AlgoConfig, learner: LearnerConfig,
                 rollout: RolloutConfig, seed: int, total_steps: int | None = None) -> None:
        super().__init__(model, algo, learner, rollout, seed, total_steps)
        self.weight_group = WeightGroup(self.device)
        self.chunked: ChunkedStep | None = None  # an overlapped step's chunks so far (learn_chunk)

    def train_step(self, *chunks: list[Group], max_groups: int | None = None) -> dict[str, float]:
        """One GRPO update on the scored groups of every chunk, the first `max_groups` of them
        when given (dynamic sampling drops the rest); the policy version advances by one.

        It is `learn_chunk` then `finish_step` on the batch as one chunk whose gradient pass waits
        for the end (tests/test_overlap.py: the same to the bit). A minibatch whose loss or gradient
        is not finite leaves the weights and AdamW's state untouched: `policy/skipped_steps` counts
        such minibatches, `policy/step_skipped` is 1.
        """
        groups = [group for chunk in chunks for group in chunk][:max_groups]
        self.chunked = self._begin_step(accumulated=False, whole=True)
        self.learn_chunk(groups, WHOLE_BATCH)
        return self._finish()

    def learn_chunk(self, groups: list[Group], key: str) -> None:
        """Overlap inside a sync step (controller/overlap.py): what can be done on one scored chunk
        while later ones are generated. pi_ref and pi_old always; with one optimizer step per batch
        (mu 1, no minibatches) the gradient pass too, its loss a plain sum (D = 1) that finish_step
        divides by the whole batch's D. `key` names the chunk (its object reference)."""
        began = time.perf_counter()
        if self.chunked is None:
            self.chunked = self._begin_step(accumulated=self.algo.mu == 1 and self.algo.minibatch_size is None)
        stats = self.chunked.stats
        batch = self._batch(groups, stats)
        # pi_old is the weights that sampled. Where the gradient pass is the batch's first, it fills
        # pi_old in (its logprobs, detached); otherwise it is computed first.
        fill_old = self.chunked.accumulated or (self.chunked.whole and self._single_step(len(batch)))
        self._old_logprobs(batch, not fill_old, stats)
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
        return {**self._finish(), "policy/overlap_fallback": float(fallback)}

    def _begin_step(self, accumulated: bool, whole: bool = False) -> ChunkedStep:
        reset_peak(self.device)
        self.weights.zero_grad()
        return ChunkedStep(accumulated=accumulated, whole=whole)

    def _finish(self) -> dict[str, float]:
        """The step's optimizer steps on the chunks taken, then its end."""
        began = time.perf_counter()
        chunked, self.chunked = self.chunked, None
        assert chunked is not None
        batch = TrainBatch.concat(chunked.parts, self.tokenizer.pad_token_id)
        single_step = self._single_step(len(batch))
        if not chunked.accumulated:
            return self._train(batch, chunked.groups, chunked.stats, single_step, chunked.learn_started, began,
                               chunked.busy_s)
        self._minibatches(len(batch))  # (one, the whole batch) the generator advances as train_step's does
        denominator = grpo.loss_denominator(batch.mask, self.algo.aggregation, self.rollout.max_new_tokens)
        divide_grads(self.weights.params, denominator)
        chunked.stats.divide_losses(denominator)
        lr = self.optimizer.param_groups[0]["lr"]
        with chunked.stats.timed("optimizer"):
            self._step(chunked.stats)
        return self._end_step(batch, chunked.groups, chunked.stats, single_step, lr, chunked.learn_started,
                              began, chunked.busy_s)

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

    # ------------------------------------------------------------ weights to the engines (export.py)

    def export_weights(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[str, torch.Tensor] | list[Any] | None:
        """The weights the engines serve (model.dtype; LoRA: merged); through Ray they land in the object
        store once. Sharded (every rank calls it): rank 0 returns the buckets' ObjectRefs, the others None."""
        return self.weights.export(bucket_bytes)

    def checksum(self) -> str:
        """`state_checksum` of what `export_weights` returns (sharded: every rank calls it)."""
        return self.weights.checksum()

    def weight_group_address(self) -> tuple[str, int]:
        """Where this node can serve a rendezvous (its IP, a free port): the weight group's, or the ranks'."""
        return WeightGroup.address()

    def join_weight_group(self, host: str, port: int, world_size: int, timeout_s: float,
                          backend: nccl.Backend = "nccl") -> None:
        """Open the weight-update group as rank 0 (nccl on a GPU; gloo is the CPU stand-in)."""
        self.weight_group.join(host, port, world_size, timeout_s, backend)

    def weight_plan(self, bucket_bytes: int) -> list[Bucket]:
        """How `send_weights` packs the state dict; every receiver needs the same plan."""
        return self.weights.weight_plan(bucket_bytes)

    def send_weights(self, buckets: list[Bucket]) -> None:
        """Broadcast the served weights over the weight group; returns when they have left."""
        self.weights.send(self.weight_group, buckets)

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
            self.weights = ShardedWeights(self.policy, self.dtype, self.ranks.rank, self.learner_config.offload,
                                          getattr(self.weights, "layers", None))
            if isinstance(self.reference, torch.nn.Module):  # LoRA's reference is the policy itself
                shard(self.reference, None, self.learner_config.offload, inference=True)
            self.optimizer = torch.optim.AdamW(self.weights.params, lr=self.algo.lr,
                                               weight_decay=self.algo.weight_decay)
            self.scheduler = make_scheduler(self.optimizer, self.algo, self.total_steps)

    # ------------------------------------------------------------ saving

    def save_state(self, directory: str) -> None:
        """The learner's share of a checkpoint (learner/state.py; sharded: every rank writes its shards);
        the caller makes it atomic."""
        counters = {"version": self.version, "optimizer_steps": self.optimizer_steps,
                    "skipped_steps": self.skipped_steps}
        self.weights.save_state(Path(directory), self.tokenizer, self.optimizer, self.scheduler,
                                self._refreshed_reference(), self.generator, counters)

    def load_state(self, directory: str) -> int:
        """Continue from `save_state`'s directory, in a learner built from the same config; returns
        the policy version restored."""
        counters = self.weights.load_state(Path(directory), self.optimizer, self.scheduler,
                                           self._refreshed_reference(), self.generator)
        self.version = counters["version"]
        self.optimizer_steps, self.skipped_steps = counters["optimizer_steps"], counters["skipped_steps"]
        return self.version

    def _refreshed_reference(self) -> Callable[..., Any] | None:
        """The reference when it is no longer model.path's (algo.ref_refresh_every replaces it), else None."""
        return self.reference if self.algo.ref_refresh_every is not None else None

    def write_probe(self, path: str, text: str) -> None:
        """Write `text` to `path` (controller/checkpoints.py's check_shared_storage: can the driver read it?)."""
        Path(path).write_text(text)

    def save(self, path: str) -> str:
        """Write the policy (float32 masters; LoRA: merged, and the adapter) and tokenizer to `path`,
        replacing a folder there atomically (sharded: every rank gathers, rank 0 writes)."""
        return str(self.weights.write_policy(self.tokenizer, Path(path)))
