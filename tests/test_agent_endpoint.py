"""agent/: the endpoint with the real openai client on 127.0.0.1, agents in their host process, a
tiny ChatML model on a real transformers engine: episodes play and train, 32 agents at once make
the same batches every run, errors come back in OpenAI's shape, and a misbehaving agent costs
only its episode."""

import json
import time
import urllib.error
import urllib.request

import openai
import pytest
from agent_helpers import Recording, mask_runs

from grpo_dist.agent.config import AgentConfig
from grpo_dist.agent.runner import AgentRunner, agent_sums
from grpo_dist.config.schema import ConfigError, load_config
from grpo_dist.env.groups import episode_groups
from grpo_dist.rollout.hf_engine import HFEngine
from grpo_dist.common.seeding import prompt_seed
from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from grpo_dist.common.types import Prompt, SamplingSettings

SAMPLING = SamplingSettings(n=2, temperature=1.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> HFEngine:
    folder = tmp_path_factory.mktemp("chat_model")
    save_tiny_model(folder, "llama", chat=True, max_positions=512, generation_config={"eos_token_id": [IM_END]})
    return HFEngine(str(folder))


@pytest.fixture
def runner_for(agent_runner):
    """runner_for(engine, agent name, **agent settings): an AgentRunner closed when the test ends."""
    def start(engine, name: str, **settings) -> AgentRunner:
        tokenizer = getattr(engine, "tokenizer", None) or engine.engine.tokenizer
        return agent_runner(engine, tokenizer, AgentConfig(name=name, max_episode_tokens=300, **settings))
    return start


def rows(count: int, **fields) -> list[dict]:
    return [{"prompt": f"What is {i}+1?", "answer": str(i + 1), **fields} for i in range(count)]


def seeds(count: int) -> list[int]:
    return [prompt_seed(0, 0, i) for i in range(count)]


def test_32_agents_at_once_play_trained_groups_and_make_the_same_batches_every_run(engine, runner_for):
    recording = Recording(engine)
    runner = runner_for(recording, "grpo_dist.agent.examples:chat", concurrency=32)
    first, second = (runner.run(rows(8), SamplingSettings(n=4, max_new_tokens=6), seeds(8)) for _ in range(2))
    assert [len(inputs) for inputs, _ in recording.calls] == [32, 32]  # one round of all 32, whatever the timing
    episodes = [e for group in first for e in group]
    assert len(episodes) == 32 and all((e.error, e.stop_reason, e.turns) == (None, "done", 1) for e in episodes)
    assert [e.samples()[0].ids for g in first for e in g] == [e.samples()[0].ids for g in second for e in g]
    assert agent_sums(episodes)["env/failed"] == 0
    groups = episode_groups([Prompt(i, row, row["prompt"], [1]) for i, row in enumerate(rows(8))], first, version=3)
    for group in groups:
        assert group.policy_version == 3 and len(group.completions) == 4
        for completion in group.completions:
            assert completion.episode["env_reward"] in (0.0, 1.0) and sum(completion.loss_mask) > 0
            assert completion.episode["transcript"][-1]["role"] == "assistant"


def test_fewer_slots_than_episodes_fill_rounds_in_order(engine, runner_for):
    """agent.concurrency=4 for 6 episodes: a round waits until the freed slots are refilled, so the
    batches are the first 4 episodes, then the last 2, in every run."""
    recording = Recording(engine)
    played = runner_for(recording, "grpo_dist.agent.examples:chat", concurrency=4).run(
        rows(3), SamplingSettings(n=2, max_new_tokens=6), seeds(3))
    assert all(e.error is None for group in played for e in group)
    assert [len(inputs) for inputs, _ in recording.calls] == [4, 2]


def test_an_episode_trains_the_engines_ids_and_logprobs_turn_by_turn(engine, runner_for):
    """The real engine's replies (recorded) are the episode's mask-1 ids and logprobs, in order, and the
    engine's second input is the episode's ids so far (SmolLM2's tokens: tests/test_agent_tokens.py)."""
    recording = Recording(engine)
    (episode,), = runner_for(recording, "agent_helpers:two_turns").run(
        rows(1), SamplingSettings(n=1, max_new_tokens=6), seeds(1))
    assert episode.error is None and episode.turns == 2
    (sample,) = episode.samples()
    replies = [outputs[0][0] for _, outputs in recording.calls]
    assert mask_runs(sample.ids, sample.loss_mask, 1) == [r.token_ids for r in replies]
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m] == [lp for r in replies for lp in r.logprobs]
    assert sample.ids[: len(recording.calls[1][0][0])] == recording.calls[1][0][0]
    assert episode.infos[0]["seen"] == [[engine.tokenizer.decode([i]) for i in r.token_ids] for r in replies]


def test_errors_come_back_in_openais_shape_never_as_a_crash(engine, runner_for):
    runner = runner_for(engine, "agent_helpers:probe")
    server = runner.server
    client = openai.OpenAI(base_url=server.base_url("nope"), api_key=server.api_key, max_retries=0)
    message = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url("nope"), api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError, match="no episode 'nope'"):
        client.chat.completions.create(model="m", messages=message)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="m", messages=[])
    with pytest.raises(openai.APIStatusError, match="max_request_bytes") as too_large:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 5_000_000}])
    assert too_large.value.status_code == 413
    request = urllib.request.Request(server.base_url("nope") + "/chat/completions", data=b"{not json",
                                     headers={"Authorization": f"Bearer {server.api_key}"})
    with pytest.raises(urllib.error.HTTPError) as malformed:
        urllib.request.urlopen(request, timeout=10)
    body = json.loads(malformed.value.read())
    assert malformed.value.code == 400 and body["error"]["message"].startswith("malformed JSON")
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert client.models.list().data[0].object == "model"
    (episode,), = runner.run(rows(1), SamplingSettings(n=1, max_new_tokens=6), seeds(1))
    assert episode.error is None and episode.infos[0]["statuses"] == [400]  # max_tokens past the config
    late = openai.OpenAI(base_url=episode.infos[0]["base_url"], api_key=server.api_key, max_retries=0)
    with pytest.raises(openai.ConflictError, match="has ended"):  # a call after the episode ended
        late.chat.completions.create(model="m", messages=message)


def test_a_closed_runner_leaves_no_host_and_no_endpoint(engine):
    runner = AgentRunner(engine, engine.tokenizer, AgentConfig(name="grpo_dist.agent.examples:chat"))
    runner.close()
    assert runner.spare.poll() is not None  # the spare host, killed and reaped
    client = openai.OpenAI(base_url=runner.server.base_url("a"), api_key=runner.server.api_key, max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_a_misbehaving_agent_costs_its_episode_only(engine, runner_for):
    runner = runner_for(engine, "agent_helpers:misbehave", timeout_s=20)
    modes = ["good", "never_calls", "raises", "nan", "rewrites"]
    played = runner.run([{"mode": m} for m in modes], SamplingSettings(n=1, max_new_tokens=6), seeds(5))
    by_mode = {mode: group[0] for mode, group in zip(modes, played)}
    assert by_mode["good"].error is None and by_mode["good"].step_rewards == [1.0]
    assert "without calling" in by_mode["never_calls"].error
    assert "RuntimeError: the agent's own bug" in by_mode["raises"].error
    assert "returned nan" in by_mode["nan"].error
    rewritten = by_mode["rewrites"]  # the request is refused, the episode keeps its turn and its reward
    assert (rewritten.error, rewritten.stop_reason, rewritten.step_rewards) == (None, "history_rewritten", [0.25])
    sums = agent_sums([group[0] for group in played])
    assert sums["env/failed"] == 3 and sums["env/stop_reasons/history_rewritten"] == 1
    assert all(sum(e.samples()[0].loss_mask) == 0 for e in played[2][0:1])  # a failed episode trains nothing


@pytest.mark.parametrize("agent", ["blocks", "sleeps", "exits"])
def test_an_agent_that_hangs_is_stopped_at_its_deadline(engine, runner_for, agent):
    """`blocks` holds its event loop with a sync sleep: only the worker's deadline and kill stop it;
    `exits` ends the host process itself (os._exit): its episode fails at once."""
    runner = runner_for(engine, f"agent_helpers:{agent}", timeout_s=2)
    started = time.monotonic()
    (episode,), = runner.run(rows(1), SamplingSettings(n=1, max_new_tokens=6), seeds(1))
    assert time.monotonic() - started < 15
    assert episode.error is not None and ("host exited" if agent == "exits" else "timeout_s=2") in episode.error


def test_the_agent_section_is_checked_before_anything_starts():
    agent = ["agent.name=grpo_dist.agent.examples:chat", "reward.functions=[{name: env_reward}]",
             "reward.accuracy_from=env_reward"]
    assert load_config(None, agent).agent.concurrency == 32
    for overrides, message in [
            ([*agent, "env.name=arithmetic_retry"], "env and agent are both set"),
            (["agent.name=grpo_dist.agent.examples:evaluate", *agent[1:]], "is not an async def"),
            (["agent.name=no_such_module:run", *agent[1:]], "cannot be imported"),
            (agent[:1], "agent is set but reward.functions"),
            ([*agent, "algo.aggregation=constant"], "use token_mean or sequence_mean with agent"),
            ([*agent, "agent.timeout_s=100"], "256 agent episodes per rollout call")]:  # 8 x 100 s + 30 s > 600 s
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
