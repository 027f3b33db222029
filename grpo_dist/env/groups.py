"""Episodes as the pipeline's Groups: one Completion per episode, its ids after the group's prompt
with the loss mask, and what rewards and samples.jsonl see of it in `Completion.episode`."""

from __future__ import annotations

import json
from typing import Any

from grpo_dist.env.runner import Episode
from grpo_dist.env.trajectory import MAX_EPISODE_TOKENS, Sample
from grpo_dist.common.types import Completion, Group, Prompt


def episode_groups(prompts: list[Prompt], played: list[list[Episode]], version: int) -> list[Group]:
    """One Group per prompt, one Completion per episode. The group's prompt ids are what its
    episodes' openings share (all of the opening when reset is the same for each); an episode
    whose opening shares not even the first token is failed (tokens not trained). A per-turn
    episode's completion carries its turns, each a whole sequence (Completion.turns)."""
    groups = []
    for prompt, episodes in zip(prompts, played):
        openings = [e.trajectory.prompt_ids for e in episodes if e.trajectory is not None and e.error is None]
        shared = _common_prefix(openings) or (openings[0][:1] if openings else list(prompt.ids))
        for episode in episodes:
            trajectory = episode.trajectory
            if episode.error is None and trajectory is not None and trajectory.prompt_ids[: len(shared)] != shared:
                episode.error = "its opening shares no token with the other episodes' of this row"
        groups.append(Group(prompt_index=prompt.index, row=prompt.row, prompt=prompt.text, prompt_ids=shared,
                            completions=[_completion(e, shared) for e in episodes], policy_version=version))
    return groups


def _completion(episode: Episode, shared_ids: list[int]) -> Completion:
    """An episode whose reset failed has no tokens: it gets one (the prompt's last, loss mask 0),
    so that a chunk of such episodes is a batch the learner can run, training on nothing."""
    samples, record, shared = episode.samples(), _record(episode), len(shared_ids)
    if not samples:
        samples = [Sample(ids=shared_ids + shared_ids[-1:], loss_mask=[0] * (shared + 1),
                          logprobs=[0.0] * (shared + 1), prompt_len=shared)]
    text = episode.replies[-1] if episode.replies else ""
    finish = "length" if episode.stop_reason == MAX_EPISODE_TOKENS else "stop"
    if episode.trajectory is not None and episode.trajectory.history == "per_turn":
        # one learner row per turn; token_ids and logprobs are the replies', for counting
        replies = [(i, lp) for s in samples for i, lp, m in zip(s.ids, s.logprobs, s.loss_mask) if m]
        return Completion(token_ids=[i for i, _ in replies], logprobs=[lp for _, lp in replies], text=text,
                          finish_reason=finish, episode=record,
                          turns=[(s.ids, s.loss_mask, s.logprobs) for s in samples])
    sample = samples[0] if samples else None
    ids, mask, logprobs = (sample.ids[shared:], sample.loss_mask[shared:], sample.logprobs[shared:]) if sample \
        else ([], [], [])
    return Completion(token_ids=ids, logprobs=logprobs, text=text, finish_reason=finish, loss_mask=mask,
                      episode=record)


def _record(episode: Episode) -> dict[str, Any]:
    """What rewards (fields env_reward, transcript, env_info) and samples.jsonl see of an episode."""
    trajectory = episode.trajectory
    transcript: Any = []
    if trajectory is not None:
        transcript = trajectory.messages if trajectory.renderer.chat else \
            trajectory.renderer.decode(trajectory.samples[0].ids)
    return {"env_reward": None if episode.error else episode.env_reward, "error": episode.error,
            "stop_reason": episode.stop_reason, "turns": episode.turns, "replies": episode.replies,
            "step_rewards": episode.step_rewards, "transcript": transcript,
            "env_info": json.loads(json.dumps(episode.infos, default=repr))}  # samples.jsonl can hold it


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    if not sequences:
        return []
    first = sequences[0]
    length = len(first)
    for other in sequences[1:]:
        length = next((i for i, (a, b) in enumerate(zip(first[:length], other)) if a != b), min(length, len(other)))
    return first[:length]
