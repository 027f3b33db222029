"""The agent Board across rollout calls: a late line from an earlier call's host (its reader thread
can outlive the call) must not touch the next call's episodes, whose ids repeat with the seeds."""

from grpo_dist.agent.board import Board
from grpo_dist.agent.episode import AgentEpisode
from grpo_dist.common.types import SamplingSettings


def test_an_earlier_calls_host_events_never_reach_the_next_calls_episodes():
    board, sampling = Board(), SamplingSettings(n=1)
    earlier = {"0.0.7": AgentEpisode(0, 0, 7, episode_id="0.0.7")}
    board.open(list(earlier.values()), sampling, 1)
    board.close()
    current = AgentEpisode(0, 0, 7, episode_id="0.0.7")  # the same seeds, so the same id
    board.open([current], sampling, 1)
    board.host_event({"id": "0.0.7", "event": "result", "reward": 1.0, "info": {}}, earlier)
    board.host_exited(earlier)  # the earlier host's reader reached its end only now
    assert current.ended is None and current.error is None and not current.returned
    board.host_event({"id": "0.0.7", "event": "started"}, {"0.0.7": current})
    board.host_exited({"0.0.7": current})
    assert current.started_at is not None and current.ended == "its agent host exited"
