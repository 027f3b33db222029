"""Agent episodes trained end to end: `python -m grpo_dist.launch` with an `agent:` section (the
built-in chat agent over the default task, a tiny chat model), two GRPO steps, its rollout worker
killed (kill -9) while agents are connected to its endpoint: the worker's agent hosts exit, Ray
restarts the worker, the chunk is played again there, and every episode trains."""

import time

import psutil
import pytest

from faults import actor_processes, ended, title
from grpo_dist.tasks.tiny import IM_END, save_tiny_model
from runs import SMALL, finish, start, train_records, wait_for


def agents_connected(worker: psutil.Process) -> list[psutil.Process]:
    """The worker's agent hosts, once one of them holds a connection to the worker's endpoint
    (agents in flight); else []."""
    hosts = [p for p in worker.children() if "grpo_dist.agent.host" in " ".join(p.cmdline())]
    ports = {c.laddr.port for c in worker.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    clients = {c.laddr.port for host in hosts for c in host.net_connections("tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port in ports}
    return hosts if clients else []


def kill_worker_with_agents_in_flight(run, timeout_s: float = 600) -> list[int]:
    """kill -9 the rollout worker while its agents are mid-episode; the pids of its agent hosts."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert run.poll() is None, f"the run ended first (exit {run.returncode})"
        assert time.monotonic() < deadline, "no agent connected to a rollout worker's endpoint"
        for worker in actor_processes("RolloutWorker", root_pid=run.pid):
            try:
                hosts = agents_connected(worker) if title(worker) == "ray::RolloutWorker.generate_chunk" else []
                if hosts:
                    worker.kill()
                    return [host.pid for host in hosts]
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.005)


@pytest.mark.timeout(1200)
@pytest.mark.slow  # a whole run
def test_two_steps_of_agent_episodes_through_the_launcher_and_a_killed_worker(tmp_path):
    save_tiny_model(tmp_path / "model", "llama", chat=True, max_positions=512,
                    generation_config={"eos_token_id": [IM_END]})
    log = tmp_path / "launch.log"
    run = start(*SMALL, f"model.path={tmp_path / 'model'}", f"trainer.output_dir={tmp_path}", "trainer.run_name=run",
                "trainer.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=2",
                "agent.name=grpo_dist.agent.examples:chat", "agent.max_episode_tokens=200", "agent.timeout_s=60",
                "reward.functions=[{name: env_reward}]", "reward.accuracy_from=env_reward", log=log)
    try:
        hosts = kill_worker_with_agents_in_flight(run)
        wait_for(lambda: all(ended(pid) for pid in hosts), run, timeout=30)  # no agent outlives its worker
    finally:
        code, output = finish(run, timeout=600, log=log)
    assert code == 0, output[-3000:]
    train = train_records(tmp_path / "run")
    assert len(train) == 2
    assert sum(r.get("rollout/restarts", 0) for r in train) == 1
    assert sum(r.get("rollout/retries", 0) for r in train) >= 1
    for record in train:  # the killed call's episodes were played again by the restarted worker, none lost
        assert record["env/failed"] == 0 and record["env/stop_reasons/done"] == 8  # 4 prompts x 2 episodes
        assert record["env/turns_mean"] == 1 and record["reward/env_reward/failures"] == 0
