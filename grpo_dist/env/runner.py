"""Episodes run turn-batched over a generation engine, environment calls running concurrently.

`EpisodeRunner.run(rows, sampling, seeds)` plays G = sampling.n episodes per row, one
Environment instance each, in rounds: one engine call samples the next reply of every
active episode (one call, so one policy version; every turn of an episode is on this
engine), then the round's environment steps run concurrently, at most env.concurrency at
once, each under env.step_timeout_s, on an event loop of their own (`EnvLoop`), never on
the engine's thread; an async environment's own coroutines run on a second loop, so that
one which blocks it with a sync call still meets its deadline. With env.waves = W > 1 the episodes are split into W fixed waves that
take turns on the engine: while one wave generates, the others' steps run, so environment
latency hides behind generation. A wave's membership never depends on timing, so every call
serves the same episodes in every run (the engines' numbers depend on the batch). An
environment that raises, answers malformed or hangs costs its episode (`Episode.error`),
never the run.

Seeds: episode j of row i is seeded `completion_seed(seeds[i], j)` (as completion j of a
single-turn group is), and its turn t samples with `turn_seed(that, t)`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_dist.common.coroutines import CoroutineLoop
from grpo_dist.env.base import Environment, EnvError, call, check_opening, check_step, solved_turn
from grpo_dist.env.config import EnvConfig
from grpo_dist.env.registry import load_environment
from grpo_dist.env.render import ChatRenderer, TextRenderer
from grpo_dist.env.trajectory import DONE, ENV_ERROR, MAX_TURNS, Sample, Trajectory
from grpo_dist.rollout.engine import GenerationEngine
from grpo_dist.common.seeding import completion_seed, turn_seed
from grpo_dist.common.types import SamplingSettings


@dataclass
class Episode:
    """One episode: its tokens, the environment's step rewards and infos, and why it ended."""

    row_index: int
    sample_index: int
    seed: int
    env: Environment | None = None
    trajectory: Trajectory | None = None
    step_rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    error: str | None = None  # the environment failed: the episode scores reward.failure_score, trains nothing
    step_s: float = 0.0  # seconds in this episode's reset and steps

    @property
    def active(self) -> bool:
        return self.error is None and self.trajectory is not None and not self.trajectory.done

    @property
    def stop_reason(self) -> str:
        if self.error is not None:
            return ENV_ERROR
        return self.trajectory.stop_reason or MAX_TURNS  # type: ignore[union-attr]

    @property
    def env_reward(self) -> float:
        return sum(self.step_rewards)

    @property
    def turns(self) -> int:
        return len(self.replies)

    def samples(self) -> list[Sample]:
        """The training samples; a failed episode's have loss mask 0 everywhere (nothing trained)."""
        if self.trajectory is None:
            return []
        if self.error is None:
            return self.trajectory.samples
        return [replace(s, loss_mask=[0] * len(s.ids), logprobs=[0.0] * len(s.ids)) for s in self.trajectory.samples]


class EpisodeRunner:
    """Plays episodes of the configured environment on `engine` (see the module docstring)."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, env: EnvConfig) -> None:
        self.engine, self.env = engine, env
        self.env_class = load_environment(env.name)
        chat = bool(getattr(tokenizer, "chat_template", None))
        self.renderer = ChatRenderer(tokenizer) if chat else TextRenderer(tokenizer)
        if env.history == "per_turn" and not self.renderer.chat:
            raise ValueError("env.history=per_turn renders each turn's context with a chat template; the model's "
                             "tokenizer has none: use env.history=append")

    def run(self, rows: list[dict[str, Any]], sampling: SamplingSettings, seeds: list[int]) -> list[list[Episode]]:
        """`sampling.n` episodes per row, one list per row."""
        if len(seeds) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(seeds)} seeds")
        with EnvLoop() as env_loop:
            return self._play(rows, sampling, seeds, env_loop)

    def _play(self, rows: list[dict[str, Any]], sampling: SamplingSettings, seeds: list[int],
              env_loop: EnvLoop) -> list[list[Episode]]:
        """The engine calls, on this thread; every environment call on `env_loop`'s."""
        calls = Calls(asyncio.Semaphore(self.env.concurrency), env_loop.coroutines)
        episodes = [Episode(i, j, completion_seed(seed, j)) for i, seed in enumerate(seeds) for j in range(sampling.n)]
        settle([env_loop.submit(self._reset(episode, rows[episode.row_index], calls)) for episode in episodes])
        waves = split(episodes, self.env.waves)
        stepping: list[list[Future]] = [[] for _ in waves]  # each wave's environment steps in flight
        one = replace(sampling, n=1)
        for turn in range(self.env.max_turns):
            last = turn == self.env.max_turns - 1
            for wave, in_flight in zip(waves, stepping):
                settle(in_flight)  # this wave's steps of the previous turn ran during the other waves' calls
                in_flight.clear()
                active = [episode for episode in wave if episode.active]
                if not active:
                    continue
                inputs = [episode.trajectory.engine_input() for episode in active]  # type: ignore[union-attr]
                outputs = self.engine.generate(inputs, one, [turn_seed(e.seed, turn) for e in active])
                for episode, (completion,) in zip(active, outputs):
                    episode.replies.append(episode.trajectory.add_reply(  # type: ignore[union-attr]
                        completion.token_ids, completion.logprobs, completion.finish_reason))
                in_flight += [env_loop.submit(self._step(e, calls, last)) for e in active if e.active]
        for in_flight in stepping:
            settle(in_flight)
        return [episodes[i : i + sampling.n] for i in range(0, len(episodes), sampling.n)]

    async def _reset(self, episode: Episode, row: dict[str, Any], calls: Calls) -> None:
        try:
            episode.env = self.env_class(**self.env.kwargs)
            episode.env.seed = episode.seed
            opening = check_opening(await self._timed(episode, calls, episode.env.reset, row))
            episode.trajectory = Trajectory(self.renderer, opening, self.env.max_episode_tokens,
                                            self.env.max_observation_tokens, self.env.history)
        except Exception as exc:  # noqa: BLE001 - whatever the environment did, it costs this episode only
            episode.error = f"reset: {_describe(exc)}"

    async def _step(self, episode: Episode, calls: Calls, last: bool) -> None:
        """The environment's answer to the episode's last reply, appended unless the episode ends."""
        env, trajectory = episode.env, episode.trajectory
        assert env is not None and trajectory is not None
        try:
            step = check_step(await self._timed(episode, calls, env.step, episode.replies[-1]))
            episode.step_rewards.append(step.reward or 0.0)
            episode.infos.append(step.info)
            if step.done:
                trajectory.stop_reason = DONE
            elif last:
                trajectory.stop_reason = MAX_TURNS
            else:
                trajectory.add_observation(step.observation)
        except Exception as exc:  # noqa: BLE001
            episode.error = f"step {episode.turns}: {_describe(exc)}"

    async def _timed(self, episode: Episode, calls: Calls, method: Any, *args: Any) -> Any:
        """`method(*args)` under the concurrency limit and env.step_timeout_s, its time counted."""
        async with calls.limit:
            started = time.perf_counter()
            try:
                return await asyncio.wait_for(call(method, *args, coroutines=calls.coroutines),
                                              self.env.step_timeout_s)
            except asyncio.TimeoutError:
                raise EnvError(f"no answer within env.step_timeout_s={self.env.step_timeout_s}") from None
            finally:
                episode.step_s += time.perf_counter() - started


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, EnvError) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Calls:
    """How one `run` makes its environment calls: at most env.concurrency at once, an async
    environment's coroutines on the loop `coroutines`."""

    limit: asyncio.Semaphore
    coroutines: CoroutineLoop


class EnvLoop:
    """An event loop on a daemon thread of its own, where the environment calls of one `run` are
    awaited under their deadlines, so that they run while the engine's thread generates (and a
    hung call, abandoned at its deadline, never holds up the engine or the process's exit); and
    `coroutines`, where async environments' methods run (coroutines.py): one that blocks it (a
    sync sleep) delays the other async episodes, never the deadlines."""

    def __enter__(self) -> EnvLoop:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="env-loop")
        self.thread.start()
        self.coroutines = CoroutineLoop("env-coroutines")
        return self

    def submit(self, coroutine: Coroutine[Any, Any, None]) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def __exit__(self, *exc_info: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
        self.coroutines.stop()


def settle(futures: list[Future]) -> None:
    """Wait for every one of `futures`, raising the first error (a bug of the runner's own: an
    environment's failures are its episode's and never reach here)."""
    for future in futures:
        future.result()


def split(episodes: list[Episode], waves: int) -> list[list[Episode]]:
    """`episodes` in `waves` contiguous parts of near-equal size, none empty (fewer parts than
    `waves` when there are fewer episodes)."""
    waves = min(waves, len(episodes)) or 1
    size, extra = divmod(len(episodes), waves)
    bounds = [w * size + min(w, extra) for w in range(waves + 1)]
    return [episodes[bounds[w] : bounds[w + 1]] for w in range(waves)]


def episode_sums(episodes: list[Episode]) -> dict[str, Any]:
    """Counts and sums of some episodes, which add up across chunks (`env_metrics` of them), and
    the first failed episode's error (`first_env_error`, when one failed)."""
    errors = [e.error for e in episodes if e.error is not None]
    truncated = sum(e.trajectory.observations_truncated for e in episodes if e.trajectory is not None)
    solved = [turn for turn in (solved_turn(e.infos) for e in episodes) if turn is not None]
    return {
        "env/episodes": float(len(episodes)),
        "env/turns_sum": float(sum(e.turns for e in episodes)),
        "env/turns_max": float(max((e.turns for e in episodes), default=0)),
        **{f"env/stop_reasons/{reason}": float(count)
           for reason, count in sorted(Counter(e.stop_reason for e in episodes).items())},
        "env/observation_truncated": float(truncated),
        "env/failed": float(len(errors)),
        **({"first_env_error": errors[0]} if errors else {}),
        "env/step_s": sum(e.step_s for e in episodes),
        **({"env/judged": float(len(solved)), "env/solved_sum": float(sum(t >= 1 for t in solved)),
            "env/solved_after_turn1_sum": float(sum(t >= 2 for t in solved))} if solved else {}),
    }


def env_metrics(sums: list[dict[str, float]]) -> dict[str, float]:
    """A step's env/ metrics from its chunks' `episode_sums`: env/turns_mean|max, env/stop_reasons/<reason>
    (episodes), env/observation_truncated, env/failed and env/step_s (seconds in environment calls,
    summed over episodes); {} without episodes. Where steps report `correct` (base.solved_turn):
    env/solved (share of those episodes solved within env.max_turns), env/solved_after_turn1 (share
    solved at turn 2 or later) and env/later_turn_share (of the solved ones, the share solved after turn 1)."""
    total: dict[str, float] = {}
    for part in sums:
        for key, value in part.items():
            if key.startswith("env/"):
                total[key] = max(total.get(key, 0.0), value) if key == "env/turns_max" else total.get(key, 0.0) + value
    if not total:
        return {}
    total["env/turns_mean"] = total.pop("env/turns_sum") / max(total.pop("env/episodes"), 1.0)
    if "env/judged" in total:
        judged, solved, later = (total.pop(f"env/{k}") for k in ("judged", "solved_sum", "solved_after_turn1_sum"))
        total.update(solved_shares(judged, solved, later, "env"))
    return total


def solved_shares(judged: float, solved: float, later: float, prefix: str) -> dict[str, float]:
    """<prefix>/solved, /solved_after_turn1 (both of the `judged` episodes) and /later_turn_share (of the
    solved ones) from counts."""
    return {f"{prefix}/solved": solved / judged, f"{prefix}/solved_after_turn1": later / judged,
            f"{prefix}/later_turn_share": later / solved if solved else 0.0}
