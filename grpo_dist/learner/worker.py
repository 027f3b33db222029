"""Learner: the trainable policy, the frozen reference, AdamW, and one GRPO update per step."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_dist import grpo, weights_nccl
from grpo_dist.config import AlgoConfig, LearnerConfig, ModelConfig, RolloutConfig
from grpo_dist.rollout.hf_engine import load_causal_lm, load_tokenizer
from grpo_dist.types import Group
from grpo_dist.weights import export_state_dict, state_checksum


@dataclass
class TrainBatch:
    """Prompt+completion sequences, right-padded, with per-token tensors aligned to targets.

    Position t of the [B, L-1] tensors scores token t+1 of `input_ids`; `mask` is 1 on
    completion tokens only.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1]
    sampler_logprobs: torch.Tensor  # [B, L-1]

    @classmethod
    def from_groups(cls, groups: list[Group], pad_id: int) -> TrainBatch:
        sequences, masks, sampler = [], [], []
        for group in groups:
            for completion in group.completions:
                prompt_len, completion_len = len(group.prompt_ids), len(completion.token_ids)
                sequences.append(group.prompt_ids + completion.token_ids)
                masks.append([0] * (prompt_len - 1) + [1] * completion_len)
                sampler.append([0.0] * (prompt_len - 1) + completion.logprobs)
        width = max(len(seq) for seq in sequences)

        def pad(rows: list[list], value: float | int, length: int) -> list[list]:
            return [row + [value] * (length - len(row)) for row in rows]

        input_ids = torch.tensor(pad(sequences, pad_id, width))
        attention = torch.tensor(pad([[1] * len(seq) for seq in sequences], 0, width))
        return cls(
            input_ids=input_ids,
            attention_mask=attention,
            mask=torch.tensor(pad(masks, 0, width - 1), dtype=torch.float32),
            sampler_logprobs=torch.tensor(pad(sampler, 0.0, width - 1), dtype=torch.float32),
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """log pi(token_{t+1} | tokens_<=t) under the sampling temperature, [B, L-1]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logprobs = (logits / temperature).log_softmax(dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


class Learner:
    """Runs as a Ray actor (see trainer.py); plain class so that it can be used directly."""

    def __init__(self, model: ModelConfig, algo: AlgoConfig, learner: LearnerConfig,
                 rollout: RolloutConfig, seed: int) -> None:
        torch.manual_seed(seed)
        torch.set_num_threads(learner.threads)
        self.device = "cuda" if learner.num_gpus > 0 and torch.cuda.is_available() else "cpu"
        self.algo, self.rollout = algo, rollout
        self.tokenizer = load_tokenizer(model.path)
        self.policy = load_causal_lm(model.path, model.dtype, self.device)
        self.reference = load_causal_lm(model.path, model.dtype, self.device) if algo.beta > 0 else None
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=algo.lr, weight_decay=algo.weight_decay)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0

    def train_step(self, *chunks: list[Group]) -> dict[str, float]:
        """One GRPO update on the scored groups of every chunk; the policy version advances by one.

        The controller passes each chunk as an object reference; Ray resolves them here.
        """
        started = time.perf_counter()
        groups = [group for chunk in chunks for group in chunk]
        batch = TrainBatch.from_groups(groups, self.tokenizer.pad_token_id)
        rewards = torch.tensor([reward for group in groups for reward in group.rewards])
        advantages = grpo.group_advantages(rewards, self.rollout.group_size, scale=self.algo.advantage_scale)
        # pi_old, the weights that sampled. With one optimizer step per batch it is the first
        # (grad) forward pass, detached; otherwise it is computed once before any step.
        single_step = self.algo.mu == 1 and (self.algo.minibatch_size or len(batch)) >= len(batch)
        old_logprobs = torch.zeros_like(batch.mask) if single_step else self._logprobs_no_grad(self.policy, batch)
        ref_logprobs = self._logprobs_no_grad(self.reference, batch) if self.reference else None
        self.policy.train()
        step_stats: list[dict[str, float]] = []
        for _ in range(self.algo.mu):
            for rows in self._minibatches(len(batch)):
                step_stats.append(self._optimizer_step(batch, rows, old_logprobs, ref_logprobs, advantages,
                                                       fill_old=single_step))
        self.policy.eval()
        metrics = self._sampler_agreement(batch, old_logprobs, self.algo.tis_cap)
        self.version += 1
        tokens = batch.mask.sum().item()
        for key in step_stats[0]:
            metrics[f"learner/{key}"] = sum(s[key] for s in step_stats) / len(step_stats)
        metrics.update({
            "learner/ratio_min": min(s["ratio_min"] for s in step_stats),
            "learner/ratio_max": max(s["ratio_max"] for s in step_stats),
            "advantage/mean": advantages.mean().item(),
            "advantage/std": advantages.std().item() if len(advantages) > 1 else 0.0,
            "advantage/zero_fraction": (advantages == 0).float().mean().item(),
            "learner/tokens_per_s": tokens * self.algo.mu / (time.perf_counter() - started),
            "learner/version": float(self.version),
            "time/learn_s": time.perf_counter() - started,
        })
        return metrics

    def _minibatches(self, size: int) -> list[torch.Tensor]:
        order = torch.randperm(size, generator=self.generator)
        step = self.algo.minibatch_size or size
        return [order[i : i + step] for i in range(0, size, step)]

    def _optimizer_step(self, batch: TrainBatch, rows: torch.Tensor, old_logprobs: torch.Tensor,
                        ref_logprobs: torch.Tensor | None, advantages: torch.Tensor,
                        fill_old: bool = False) -> dict[str, float]:
        """One optimizer step on `rows`; with `fill_old`, this pass's logprobs become pi_old first."""
        input_ids, attention = batch.input_ids[rows].to(self.device), batch.attention_mask[rows].to(self.device)
        logprobs = token_logprobs(self.policy, input_ids, attention, self.rollout.temperature)
        mask = batch.mask[rows].to(self.device)
        if fill_old:
            old_logprobs[rows] = logprobs.detach().cpu() * batch.mask[rows]
        loss, stats = grpo.policy_loss(
            logprobs,
            old_logprobs[rows].to(self.device),
            advantages[rows].to(self.device),
            mask,
            ref_logprobs=None if ref_logprobs is None else ref_logprobs[rows].to(self.device),
            beta=self.algo.beta,
            clip_low=self.algo.clip_low,
            clip_high=self.algo.clip_high,
            aggregation=self.algo.aggregation,
            max_tokens=self.rollout.max_new_tokens,
            sampler_logprobs=batch.sampler_logprobs[rows].to(self.device),
            tis_cap=self.algo.tis_cap,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.algo.max_grad_norm)
        self.optimizer.step()
        return {"loss": loss.item(), "grad_norm": grad_norm.item(), **stats}

    @torch.no_grad()
    def _logprobs_no_grad(self, model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
        step = self.algo.minibatch_size or len(batch)
        parts = [
            token_logprobs(model, batch.input_ids[i : i + step].to(self.device),
                           batch.attention_mask[i : i + step].to(self.device), self.rollout.temperature).cpu()
            for i in range(0, len(batch), step)
        ]
        return torch.cat(parts) * batch.mask

    @staticmethod
    def _sampler_agreement(batch: TrainBatch, learner_logprobs: torch.Tensor,
                           tis_cap: float | None) -> dict[str, float]:
        """How far the sampler's logprobs are from the learner's for the same tokens, and the
        importance weights pi_learner / pi_sampler that this gap implies."""
        valid = batch.mask.bool()
        diff = (batch.sampler_logprobs - learner_logprobs)[valid].abs()
        weights = grpo.importance_weight_stats(learner_logprobs, batch.sampler_logprobs, batch.mask, tis_cap)
        return {"rollout/logprob_diff_mean": diff.mean().item(), "rollout/logprob_diff_max": diff.max().item(),
                **{f"rollout/{name}": value for name, value in weights.items()}}

    def logprobs(self, groups: list[Group]) -> list[list[list[float]]]:
        """The learner's logprobs of each completion's tokens, shaped like the groups."""
        batch = TrainBatch.from_groups(groups, self.tokenizer.pad_token_id)
        values = self._logprobs_no_grad(self.policy, batch)
        out, row = [], 0
        for group in groups:
            start = len(group.prompt_ids) - 1
            out.append([values[row + i, start : start + len(c.token_ids)].tolist()
                        for i, c in enumerate(group.completions)])
            row += len(group.completions)
        return out

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The current weights; returned through Ray they land in the object store once."""
        return export_state_dict(self.policy)

    def checksum(self) -> str:
        return state_checksum(self.policy.state_dict())

    def weight_group_address(self) -> tuple[str, int]:
        """Where this node can serve the weight group's rendezvous: its IP and a free port."""
        import socket

        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_weight_group(self, host: str, port: int, world_size: int, timeout_s: float,
                          backend: weights_nccl.Backend = "nccl") -> None:
        """Open the weight-update group as rank 0 (nccl on a GPU; gloo is the CPU stand-in)."""
        self.weight_group = weights_nccl.communicator(backend, host, port, 0, world_size, self.device, timeout_s)

    def weight_plan(self, bucket_bytes: int) -> list[weights_nccl.Bucket]:
        """How `send_weights` packs the state dict; every receiver needs the same plan."""
        return weights_nccl.plan_buckets(self.policy.state_dict(), bucket_bytes)

    def send_weights(self, buckets: list[weights_nccl.Bucket]) -> None:
        """Broadcast the current weights over the weight group; returns when they have left."""
        weights_nccl.send(self.weight_group, self.policy.state_dict(), buckets, self.device)
        if self.device != "cpu":
            torch.cuda.synchronize(self.device)

    def leave_weight_group(self) -> None:
        self.weight_group = None

    def save(self, path: str) -> str:
        """Write the policy and tokenizer to `path` atomically (a temporary folder, then rename)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        self.policy.save_pretrained(staging)
        self.tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        return str(target)
