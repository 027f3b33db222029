"""RewardWorker: scores completions with the configured, weighted reward functions.

Per-sample rewards run in a pool of scoring processes with a deadline per sample (the
unit-test runner's programs run there in parallel, `processes` at a time), except those
marked `@inline` (quick: exact_answer, length_penalty), called here on a thread, each under the
same deadline (one that passes it moves that reward into the pool); async rewards are awaited
here, concurrently, each under the same deadline; batched rewards (a reward model) are called
here on a thread once per batch, under `batch_timeout_s`. What they print is capped
(bounded.py). A reward that raises, hangs or returns NaN costs the sample (for a batched
reward that raises or hangs: the whole batch) `failure_score` and a counter in the metrics;
it never stops the run.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from grpo_dist.config.schema import RewardConfig, RewardFunctionConfig
from grpo_dist.common.coroutines import CoroutineLoop
from grpo_dist.reward.bounded import call_in_order, capped_output
from grpo_dist.reward.chunk_stats import FAILURES, FIRST_ERROR, informative, per_group, summarize
from grpo_dist.reward.pool import (Item, ScoreOutcome, ScoringPool, call_outcome, exception_outcome,
                                   value_outcome)
from grpo_dist.reward.registry import (
    COMPLETION_TOKENS,
    Reward,
    load_reward,
    reward_kind,
    reward_spec,
    takes_completion_tokens,
)
from grpo_dist.common.types import Completion, Group


def reward_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The row's fields as keyword arguments; `prompt`/`completion` are passed positionally."""
    return {key: value for key, value in row.items() if key not in ("prompt", "completion")}


def episode_fields(completion: Completion) -> dict[str, Any]:
    """A multi-turn episode's fields for rewards (env/groups.py): env_reward, transcript, env_info."""
    episode = completion.episode
    if episode is None:
        return {}
    return {"env_reward": episode["env_reward"], "transcript": episode["transcript"], "env_info": episode["env_info"]}


def model_tokens(completion: Completion) -> int:
    """The completion's own tokens (an episode's: the model's, not the environment's)."""
    return len(completion.token_ids) if completion.loss_mask is None else sum(completion.loss_mask)


@dataclass(frozen=True)
class Sample:
    """One completion to score, with its row's fields and its length in tokens."""

    prompt: str
    completion: str
    fields: dict[str, Any]
    completion_tokens: int


class RewardWorker:
    """Runs as a Ray actor (see controller/actors.py); plain class so that it can be used directly."""

    def __init__(self, reward: RewardConfig) -> None:
        self.config = reward
        self.functions = {f.name: load_reward(f.name) for f in reward.functions}
        self.kinds = {name: reward_kind(function) for name, function in self.functions.items()}
        self.batched = {f.name: _build_batched(self.functions[f.name], f) for f in reward.functions
                        if self.kinds[f.name] == "batched"}
        self.pool: ScoringPool | None = None
        if "sample" in self.kinds.values():
            self.scoring_pool()  # started with the actor, not at its first chunk
        self.stuck: dict[str, threading.Thread] = {}  # a batched reward's call past its deadline

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        """Fill each group's `rewards` (weighted sum) and `reward_parts` (per function)."""
        samples = [
            Sample(group.prompt, completion.text, {**reward_fields(group.row), **episode_fields(completion)},
                   model_tokens(completion))
            for group in groups
            for completion in group.completions
        ]
        totals = [0.0] * len(samples)
        parts: dict[str, list[float]] = {}
        failures: dict[str, Any] = {}
        for function in self.config.functions:
            with capped_output():
                outcomes = self.outcomes(function, samples)
            values = [self.config.failure_score if o.error else o.value for o in outcomes]
            errors = [o.error for o in outcomes if o.error is not None]
            failures[f"reward/{function.name}{FAILURES}"] = float(len(errors))
            failures.update({f"reward/{function.name}{FIRST_ERROR}": errors[0]} if errors else {})
            parts[function.name] = values
            totals = [total + function.weight * value for total, value in zip(totals, values)]
        start = 0
        for group in groups:
            end = start + len(group.completions)
            group.rewards = totals[start:end]
            group.reward_parts = {name: values[start:end] for name, values in parts.items()}
            start = end
        return groups, failures

    def score_chunk(self, groups: list[Group], informative_only: bool = False
                    ) -> tuple[list[Group], dict[str, float]]:
        """`score`, plus what the controller needs to know about the chunk, small: its sums
        (chunk_stats.summarize, over every group scored), the failure counts, and the time
        scoring took. With `informative_only` (dynamic sampling) only the groups whose rewards
        are not all equal are returned, and `informative` counts them."""
        started = time.perf_counter()
        groups, failures = self.score(groups)
        summary = summarize(groups, self.config.accuracy_from)
        if informative_only:
            groups = [group for group, keep in zip(groups, informative(groups)) if keep]
            summary["informative"] = float(len(groups))
        return groups, {**failures, **summary, "score_s": time.perf_counter() - started}

    def score_for_evaluation(self, groups: list[Group], accuracy_from: str) -> dict[str, list[float]]:
        """`score`, then only what evaluation needs of each group (chunk_stats.per_group, correct
        by `accuracy_from`'s score): the groups stay here, the driver gets a few numbers per prompt."""
        scored, _ = self.score(groups)
        return per_group(scored, accuracy_from)

    def outcomes(self, function: RewardFunctionConfig, samples: list[Sample]) -> list[ScoreOutcome]:
        """One function's outcome for each sample, by the function's kind."""
        kind = self.kinds[function.name]
        if kind == "batched":
            return self.batched_outcomes(function.name, samples)
        reward = self.functions[function.name]
        with_tokens = takes_completion_tokens(reward)
        keywords = [_keywords(function, sample, with_tokens) for sample in samples]
        items = [(s.prompt, s.completion, k) for s, k in zip(samples, keywords)]
        if kind == "inline":
            return self.inline_outcomes(function.name, items)
        if kind == "async":
            coroutines = CoroutineLoop("reward-coroutines")
            try:
                return asyncio.run(_await_each(reward, samples, keywords, self.config.timeout_s, coroutines))
            finally:
                coroutines.stop()
        return self.scoring_pool().score(reward_spec(function.name), items)

    def inline_outcomes(self, name: str, items: list[Item]) -> list[ScoreOutcome]:
        """An inline reward's outcomes, called in order on a thread, each under `timeout_s`. At the
        first call past it, that sample fails and the reward moves into the scoring pool for good
        (where a hang is killed): its stuck thread is left, one per reward at most."""
        calls = [functools.partial(call_outcome, self.functions[name], item) for item in items]
        done = call_in_order(calls, self.config.timeout_s, f"reward-{name}")
        if done.stuck is None:
            return done.results
        self.kinds[name] = "sample"
        print(f"warning: inline reward {name} passed reward.timeout_s={self.config.timeout_s}; its call is left "
              "running on a thread and it is scored in the scoring pool from now on", file=sys.__stderr__)
        rest = items[len(done.results) + 1:]
        return [*done.results, ScoreOutcome(None, "timeout"), *self.scoring_pool().score(reward_spec(name), rest)]

    def batched_outcomes(self, name: str, samples: list[Sample]) -> list[ScoreOutcome]:
        """A batched reward's outcomes, its call on a thread under `batch_timeout_s`: past it, every
        sample of the call fails, and so does each later call while the stuck one has not returned."""
        if name in self.stuck and self.stuck[name].is_alive():
            return [ScoreOutcome(None, "timeout: its call past reward.batch_timeout_s has not returned")] * len(samples)
        done = call_in_order([functools.partial(_call_batched, self.batched[name], samples)],
                             self.config.batch_timeout_s, f"reward-{name}")
        if done.stuck is None:
            return done.results[0]
        self.stuck[name] = done.stuck
        return [ScoreOutcome(None, "timeout")] * len(samples)

    def scoring_pool(self) -> ScoringPool:
        """The scoring processes, started when a reward first needs them."""
        if self.pool is None:
            self.pool = ScoringPool(self.config.processes, self.config.timeout_s)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _keywords(function: RewardFunctionConfig, sample: Sample, with_tokens: bool) -> dict[str, Any]:
    """The row's fields, the configured options over them, and the token count if asked for."""
    keywords = {**sample.fields, **function.kwargs}
    if with_tokens:
        keywords[COMPLETION_TOKENS] = sample.completion_tokens
    return keywords


def _build_batched(reward: Reward, function: RewardFunctionConfig) -> Reward:
    """A batched class is built once with the options; a batched function gets them on every call."""
    if isinstance(reward, type):
        return reward(**function.kwargs)
    return functools.partial(reward, **function.kwargs)


def _call_batched(reward: Reward, samples: list[Sample]) -> list[ScoreOutcome]:
    """Call a batched reward on every sample at once; if it raises, each sample fails."""
    names = sorted({name for sample in samples for name in sample.fields})
    columns = {name: [sample.fields.get(name) for sample in samples] for name in names}
    if takes_completion_tokens(reward):
        columns[COMPLETION_TOKENS] = [sample.completion_tokens for sample in samples]
    try:
        values = list(reward([s.prompt for s in samples], [s.completion for s in samples], **columns))
        if len(values) != len(samples):
            raise ValueError(f"returned {len(values)} scores for {len(samples)} samples")
    except Exception as exc:  # a batched reward's failure costs its batch, never the run
        return [exception_outcome(exc)] * len(samples)
    return [_safe_outcome(value) for value in values]


def _safe_outcome(value: Any) -> ScoreOutcome:
    try:
        return value_outcome(value)
    except (TypeError, ValueError) as exc:
        return exception_outcome(exc)


async def _await_each(reward: Reward, samples: list[Sample], keywords: list[dict[str, Any]], timeout_s: float,
                      coroutines: CoroutineLoop) -> list[ScoreOutcome]:
    """Await an async reward on every sample concurrently, each under `timeout_s`; the reward's
    coroutines run on `coroutines`, so that a deadline fires even when one blocks its loop."""

    async def one(sample: Sample, keyword: dict[str, Any]) -> ScoreOutcome:
        try:
            scored = coroutines.run(reward(sample.prompt, sample.completion, **keyword))
            return value_outcome(await asyncio.wait_for(scored, timeout_s))
        except TimeoutError:
            return ScoreOutcome(None, "timeout")
        except Exception as exc:
            return exception_outcome(exc)

    return list(await asyncio.gather(*(one(s, k) for s, k in zip(samples, keywords))))
