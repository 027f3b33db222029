"""env/runner.py on a real transformers engine and a tiny ChatML model: episodes are the
template's own ids, the sampler's logprobs are the model's on exactly those ids (the engine saw
the trajectory), turn batching changes no episode, and bad environments cost only their episode."""

import time

import pytest
import torch

from grpo_dist.config.schema import RewardConfig
from grpo_dist.env.config import EnvConfig
from grpo_dist.env.groups import episode_groups
from grpo_dist.env.runner import EpisodeRunner, env_metrics, episode_sums
from grpo_dist.learner.batch import TrainBatch
from grpo_dist.learner.logprobs import token_logprobs
from grpo_dist.reward.rules import length_penalty
from grpo_dist.reward.worker import RewardWorker
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.common.seeding import completion_seed, prompt_seed, turn_seed
from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from grpo_dist.common.types import Prompt, SamplingSettings

ROWS = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "Say 7.", "answer": "7"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> HFEngine:
    """A tiny ChatML model that stops at <|im_end|> (and <eos>). Llama: a saved qwen2 checkpoint
    reloads its tokenizer as Qwen2Tokenizer, which drops spaces and newlines (transformers 5.19)."""
    folder = tmp_path_factory.mktemp("chat_model")
    save_tiny_model(folder, "llama", chat=True, max_positions=512, generation_config={"eos_token_id": [IM_END]})
    return HFEngine(str(folder))


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def play(engine, rows=ROWS, n=2, seeds=None, max_new_tokens=6, **env) -> list:
    config = EnvConfig(**{"name": "env_helpers:Countdown", "kwargs": {"turns": 3}, **env})
    sampling = SamplingSettings(n=n, temperature=1.0, max_new_tokens=max_new_tokens)
    seeds = seeds or [prompt_seed(0, 0, i) for i in range(len(rows))]
    return EpisodeRunner(engine, engine.tokenizer, config).run(rows, sampling, seeds)


def test_episodes_are_the_templates_ids_and_the_engine_saw_exactly_them(engine):
    tokenizer = engine.tokenizer
    groups = play(engine)
    assert [len(group) for group in groups] == [2, 2]
    for row, group in zip(ROWS, groups):
        for episode in group:
            assert (episode.stop_reason, episode.turns, episode.error) == ("done", 3, None)
            (sample,) = episode.samples()
            messages = episode.trajectory.messages
            assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
            assert messages[0]["content"] == row["prompt"] and messages[2]["content"] == "2 left"
            whole = encode(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False))
            assert sample.ids == whole[: len(sample.ids)]
            assert whole[len(sample.ids):] in (encode(tokenizer, "\n"), encode(tokenizer, IM_END + "\n"))
            # the mask, from the template: reply k starts where the conversation before it ends and
            # holds its content, plus <|im_end|> when the model ended the turn with it: when it stopped
            # before max_new_tokens=6 and not on <eos> (the other stop token, kept in the content)
            expected = [0] * len(sample.ids)
            for k in range(3):
                start = len(encode(tokenizer, tokenizer.apply_chat_template(
                    messages[: 2 * k + 1], tokenize=False, add_generation_prompt=True)))
                content = encode(tokenizer, messages[2 * k + 1]["content"])
                ended_with_im_end = len(content) < 6 and content[-1:] != [tokenizer.eos_token_id]
                end = start + len(content) + ended_with_im_end
                expected[start:end] = [1] * (end - start)
            assert sample.loss_mask == expected
            # the sampler's logprobs are the model's at exactly these ids: what the engine conditioned on
            ids = torch.tensor([sample.ids])
            model, _ = token_logprobs(engine.model, ids, torch.ones_like(ids), temperature=1.0)
            mask = torch.tensor(sample.loss_mask[1:]).bool()
            torch.testing.assert_close(torch.tensor(sample.logprobs[1:])[mask], model[0][mask], atol=1e-4, rtol=0)
            assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask) if not m)


def test_turn_batching_changes_no_episode(engine):
    seeds = [prompt_seed(3, 0, i) for i in range(len(ROWS))]
    batched = play(engine, n=2, seeds=seeds, kwargs={"turns": 2})
    alone = [play(engine, rows=[row], n=2, seeds=[seed], kwargs={"turns": 2}) for row, seed in zip(ROWS, seeds)]
    assert batched[0][0].replies != batched[0][1].replies  # each episode has a stream of its own
    assert batched[0][1].env.seed == completion_seed(seeds[0], 1)  # environments get the episode's seed
    for i, group in enumerate(batched):
        for j, episode in enumerate(group):
            assert episode.samples()[0].ids == alone[i][0][j].samples()[0].ids
            assert episode.replies == alone[i][0][j].replies


@pytest.mark.parametrize("waves", [1, 2])
def test_a_bad_environment_costs_its_episode_never_the_run(engine, waves):
    rows = [{**ROWS[0], "bad": bad} for bad in ("none", "raise", "malformed", "hang")]
    started = time.perf_counter()
    groups = play(engine, rows=rows, n=1, step_timeout_s=1.0, name="env_helpers:BadEnv", waves=waves)
    assert time.perf_counter() - started < 30  # the hanging step was abandoned after 1 s
    good, raised, malformed, hung = (group[0] for group in groups)
    assert good.error is None and good.stop_reason == "done"
    assert "RuntimeError: the environment broke" in raised.error
    assert "must return a Step" in malformed.error
    assert "env.step_timeout_s=1.0" in hung.error
    for episode in (raised, malformed, hung):
        assert episode.stop_reason == "env_error"
        assert all(sum(sample.loss_mask) == 0 for sample in episode.samples())  # nothing trained
    metrics = env_metrics([episode_sums([g[0] for g in groups[:2]]), episode_sums([g[0] for g in groups[2:]])])
    assert metrics["env/failed"] == 3 and metrics["env/stop_reasons/env_error"] == 3
    assert metrics["env/stop_reasons/done"] == 1 and metrics["env/turns_max"] == 3
    assert metrics["env/turns_mean"] == (3 + 1 + 1 + 1) / 4  # the failed ones replied once


def test_resets_that_raise_or_hang_cost_their_episode_and_a_last_step_may_have_no_observation(engine):
    rows = [{**ROWS[0], "bad": bad} for bad in ("none", "reset_raise", "reset_hang", "none_at_end")]
    groups = play(engine, rows=rows, n=1, step_timeout_s=1.0, name="env_helpers:BadEnv")
    good, raised, hung, none_at_end = (group[0] for group in groups)
    assert good.error is None and good.stop_reason == "done"
    assert raised.error == "reset: RuntimeError: reset broke" and raised.samples() == []
    assert hung.error == "reset: no answer within env.step_timeout_s=1.0"
    # Step(observation=None, done=True): nothing to append after the last turn, the episode is whole
    assert none_at_end.error is None and none_at_end.stop_reason == "done" and none_at_end.turns == 3
    assert sum(none_at_end.samples()[0].loss_mask) > 0  # trained on


def test_async_environments_meet_their_deadline_even_when_they_block_their_event_loop(engine):
    """An async step or reset that awaits forever, and one that blocks its event loop with a sync
    sleep of 4 s (asyncio.wait_for on that loop could not fire until the sleep ended), each fail
    at env.step_timeout_s=1."""
    rows = [{**ROWS[0], "bad": bad} for bad in ("none", "hang", "reset_hang")]
    started = time.perf_counter()
    good, hung, reset_hung = (g[0] for g in play(engine, rows=rows, n=1, step_timeout_s=1.0,
                                                 name="env_helpers:AsyncBadEnv"))
    assert good.error is None and good.stop_reason == "done"
    assert hung.error == "step 1: no answer within env.step_timeout_s=1.0"
    assert reset_hung.error == "reset: no answer within env.step_timeout_s=1.0"
    for bad in ("block", "reset_block"):  # the whole loop is blocked: every async episode waits, each fails
        started = time.perf_counter()
        episodes = [g[0] for g in play(engine, rows=[{**ROWS[0], "bad": bad}] * 2, n=1, step_timeout_s=1.0,
                                       name="env_helpers:AsyncBadEnv")]
        assert time.perf_counter() - started < 3.5, bad  # not the 4 s the blocking call takes
        assert {e.error.split(": ", 1)[1] for e in episodes} == {"no answer within env.step_timeout_s=1.0"}, bad


def test_a_huge_observation_is_cut_and_a_huge_opening_refused_without_encoding_all_of_it(engine):
    """16 MiB of observation per step: cut to env.max_observation_tokens, counted, in milliseconds
    (encoding all of it took 70 s and 6.8 GB with the tiny tokenizer); a 16 MiB opening: the
    episode fails, as an opening over env.max_episode_tokens does."""
    started = time.perf_counter()
    (episode,), = play(engine, rows=[{**ROWS[0], "bad": "huge"}], n=1, name="env_helpers:BadEnv",
                       max_observation_tokens=16)
    assert time.perf_counter() - started < 5
    # env.max_turns=4: three observations, each cut and counted
    assert episode.error is None and episode.trajectory.observations_truncated == 3 and episode.turns == 4
    started = time.perf_counter()
    (opening,), = play(engine, rows=[{**ROWS[0], "bad": "huge_opening"}], n=1, name="env_helpers:BadEnv")
    assert time.perf_counter() - started < 5  # a 16 MiB opening is refused from its first few thousand characters
    assert opening.error == "reset: the opening is more than env.max_episode_tokens=1024 tokens"


def test_environment_calls_run_concurrently(engine):
    rows = [dict(ROWS[0]) for _ in range(8)]
    started = time.perf_counter()
    groups = play(engine, rows=rows, n=1, name="env_helpers:AsyncCountdown",
                  kwargs={"turns": 2, "delay_s": 0.5}, max_new_tokens=2)
    wall = time.perf_counter() - started
    steps = sum(g[0].step_s for g in groups)  # 8 episodes x (reset + 2 steps) x 0.5 s = 12 s one at a time
    assert steps >= 11.5 and wall < 6, (steps, wall)
    assert all(g[0].stop_reason == "done" for g in groups)


class LoggedEngine:
    """The real engine, each call made to last at least `min_s` (a bigger model's generation) and
    logged as (episode seeds served, started, ended)."""

    def __init__(self, engine: HFEngine, min_s: float) -> None:
        self.engine, self.min_s, self.calls = engine, min_s, []

    def generate(self, prompt_ids, sampling, seeds):
        started = time.perf_counter()
        outputs = self.engine.generate(prompt_ids, sampling, seeds)
        time.sleep(max(0.0, self.min_s - (time.perf_counter() - started)))
        self.calls.append((seeds, started, time.perf_counter()))
        return outputs


@pytest.mark.parametrize("waves", [1, 2])
def test_waves_overlap_environment_steps_with_generation_and_change_no_episode(engine, waves):
    """With 2 waves each wave's steps run while the other wave generates; with 1 (lock-step) no
    step overlaps a call. Either way every call serves a fixed set of episodes and the episodes
    are the lock-step ones, token for token and logprob for logprob."""
    from env_helpers import TimedCountdown

    rows = [dict(ROWS[i % 2]) for i in range(4)]
    config = EnvConfig(name="env_helpers:TimedCountdown", kwargs={"turns": 3, "delay_s": 0.15}, waves=waves)
    sampling = SamplingSettings(n=2, temperature=1.0, max_new_tokens=4)
    seeds = [prompt_seed(5, 0, i) for i in range(len(rows))]
    logged = LoggedEngine(engine, min_s=0.3)
    TimedCountdown.steps.clear()
    groups = EpisodeRunner(logged, engine.tokenizer, config).run(rows, sampling, seeds)
    episodes = [episode for group in groups for episode in group]
    assert all(e.stop_reason == "done" and e.turns == 3 for e in episodes)
    # each call serves one wave's episodes, the same every turn: the first half or the second
    halves = [{e.seed for e in episodes[:4]}, {e.seed for e in episodes[4:]}]
    served = [{seed for seed in episode_seeds} for episode_seeds, _, _ in logged.calls]
    turn_seeds = {turn_seed(e.seed, t): e.seed for e in episodes for t in range(3)}
    served = [{turn_seeds[s] for s in call} for call in served]
    assert served == ([halves[0] | halves[1]] * 3 if waves == 1 else [halves[0], halves[1]] * 3)
    overlapping = [(seed, call) for seed, s0, s1 in TimedCountdown.steps for call in logged.calls
                   if s0 < call[2] and call[1] < s1]
    if waves == 1:
        assert overlapping == []
    else:  # every step but the last wave's last overlaps the other wave's call, never its own
        assert len({(seed, s0) for seed, s0, _ in TimedCountdown.steps}) == 24
        assert len({seed for seed, _ in overlapping}) == 8
        assert all(turn_seeds[s] != seed for seed, call in overlapping for s in call[0])
    lock_step = play(engine, rows=rows, n=2, seeds=seeds, max_new_tokens=4, kwargs={"turns": 3})
    for episode, reference in zip(episodes, [e for group in lock_step for e in group]):
        assert episode.samples()[0].ids == reference.samples()[0].ids
        if waves == 1:  # the same batches as lock-step: the same numbers to the bit
            assert episode.samples()[0].logprobs == reference.samples()[0].logprobs


def test_sync_environment_calls_reuse_their_threads_and_a_hung_one_holds_only_its_own():
    import threading

    from grpo_dist.env.base import DaemonThreads

    before = set(threading.enumerate())
    threads, release = DaemonThreads(), threading.Event()
    threads.run(release.wait)  # hangs until released
    finished = []
    for k in range(50):
        threads.run(lambda k=k: finished.append(k))
        deadline = time.perf_counter() + 5
        while len(finished) <= k and time.perf_counter() < deadline:
            time.sleep(0.001)
    assert finished == list(range(50))  # none waited on the hung job
    started = set(threading.enumerate()) - before
    assert len(started) == 2 and all(t.daemon for t in started)  # the hung job's, and one for all the others
    release.set()


def test_episodes_become_groups_that_train_and_score_on_the_models_tokens(engine):
    tokenizer = engine.tokenizer
    rows = [{**ROWS[0], "bad": "none"}, {**ROWS[1], "bad": "raise"}]
    played = play(engine, rows=rows, name="env_helpers:BadEnv")
    prompts = [Prompt(index=7 + i, row=row, text=row["prompt"], ids=encode(tokenizer, tokenizer.apply_chat_template(
        [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True)))
        for i, row in enumerate(rows)]
    groups = episode_groups(prompts, played, version=3)
    assert [g.prompt_index for g in groups] == [7, 8] and all(g.policy_version == 3 for g in groups)
    batch = TrainBatch.from_groups(groups, pad_id=tokenizer.pad_token_id)
    row = 0
    for group, prompt, episodes in zip(groups, prompts, played):
        assert group.prompt_ids == prompt.ids  # the openings are the data's rendering of the row
        for completion, episode in zip(group.completions, episodes):
            (sample,) = episode.samples()
            assert group.prompt_ids + completion.token_ids == sample.ids
            assert batch.mask[row, : len(sample.ids) - 1].tolist() == sample.loss_mask[1:]
            assert batch.mask[row].sum() == (sum(sample.loss_mask) if episode.error is None else 0)
            assert completion.text == episode.replies[-1] and completion.episode["turns"] == episode.turns
            row += 1
    worker = RewardWorker(RewardConfig(functions=[{"name": "env_reward"}, {"name": "length_penalty", "weight": 0.5,
                                                  "kwargs": {"soft_length": 2, "max_length": 100}}],
                                       accuracy_from="env_reward", failure_score=-1.0))
    try:
        scored, failures = worker.score(groups)
    finally:
        worker.close()
    assert failures["reward/env_reward/failures"] == 2  # the raising environment's two episodes
    for group, episodes in zip(scored, played):
        for k, episode in enumerate(episodes):
            env_part = -1.0 if episode.error else episode.env_reward
            assert group.reward_parts["env_reward"][k] == env_part
            # the length penalty counts the model's tokens, not the environment's
            model_tokens = sum(episode.samples()[0].loss_mask)
            expected = length_penalty("", "", completion_tokens=model_tokens, soft_length=2, max_length=100)
            assert group.reward_parts["length_penalty"][k] == pytest.approx(expected)
            assert group.rewards[k] == pytest.approx(env_part + 0.5 * expected)


def test_per_turn_episodes_train_one_row_per_turn_on_the_templates_fresh_rendering(engine):
    tokenizer = engine.tokenizer
    played = play(engine, rows=ROWS[:1], history="per_turn")
    prompt = Prompt(index=0, row=ROWS[0], text="", ids=encode(tokenizer, tokenizer.apply_chat_template(
        [{"role": "user", "content": ROWS[0]["prompt"]}], tokenize=False, add_generation_prompt=True)))
    (group,) = episode_groups([prompt], played, version=0)
    batch = TrainBatch.from_groups([group], tokenizer.pad_token_id, advantages=torch.tensor([2.0, -2.0]))
    assert len(batch) == 6 and batch.advantages.tolist() == [2.0] * 3 + [-2.0] * 3  # 2 episodes x 3 turns
    row = 0
    for episode, completion in zip(played[0], group.completions):
        messages = episode.trajectory.messages
        assert len(completion.turns) == 3 and completion.token_ids == [
            i for ids, mask, _ in completion.turns for i, m in zip(ids, mask) if m]
        for k, (ids, mask, logprobs) in enumerate(completion.turns):
            context = encode(tokenizer, tokenizer.apply_chat_template(messages[: 2 * k + 1], tokenize=False,
                                                                      add_generation_prompt=True))
            assert ids[: len(context)] == context and mask == [0] * len(context) + [1] * (len(ids) - len(context))
            reply = tokenizer.decode(ids[len(context):], skip_special_tokens=True)
            assert reply == episode.replies[k]
            assert batch.mask[row, : len(ids) - 1].tolist() == mask[1:]
            tensor = torch.tensor([ids])
            model, _ = token_logprobs(engine.model, tensor, torch.ones_like(tensor), temperature=1.0)
            torch.testing.assert_close(torch.tensor(logprobs[len(context):]), model[0][len(context) - 1:],
                                       atol=1e-4, rtol=0)
            row += 1
