"""A node that dies, on a simulated cluster (ray.cluster_utils.Cluster, slow tier).

The rollout worker is pinned to "engine" nodes (a custom resource); the learner and the reward
actor live on the head. Removing the engine node that holds the worker kills its processes and
its raylet, as a machine that is lost would:

- with a second engine node, Ray places the worker's placement-group bundle again there and
  restarts the worker; the run gets it back, gives it the current weights and completes;
- with none, the worker cannot be placed anywhere: the run stops within
  cluster.actor_start_timeout_s, saying so, with its last checkpoint on disk. No hang either way.
"""

import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from grpo_dist.config.schema import load_config
from grpo_dist.controller.cluster import shutdown_ray
from grpo_dist.controller.errors import ActorGone
from grpo_dist.controller.run import TrainingRun
from runs import train_records

pytestmark = pytest.mark.slow

ENGINE = {"num_cpus": 1, "resources": {"engine_node": 1}}
RUN = ["rollout.num_workers=1", "rollout.resources={engine_node: 1}", "rollout.engine=transformers",
       "rollout.num_cpus=0.5", "rollout.threads=1", "rollout.group_size=4", "rollout.prompts_per_step=8",
       "learner.num_cpus=0.5", "learner.threads=1", "algo.lr=1e-3", "data.eval_rows=8", "trainer.eval_every=0",
       "trainer.save_final=false", "trainer.progress=false", "trainer.loggers=[jsonl]", "trainer.checkpoint_every=2",
       "cluster.actor_start_timeout_s=60"]


def engine_node_of_the_worker(trainer: TrainingRun, nodes: list) -> object:
    [where] = ray.get([w.describe.remote() for w in trainer.actors.rollouts])
    [node] = [n for n in nodes if n.node_id == where["node_id"]]
    return node


def run_and_remove_the_worker_node(tmp_path: Path, engine_nodes: int, steps: int) -> tuple[TrainingRun, float, object]:
    """Train on a head plus `engine_nodes` engine nodes; once two steps are done, remove the
    node that holds the rollout worker. Returns (the trainer, seconds from the removal to the
    end of the run, the run's result: its summary or the exception that ended it)."""
    shutdown_ray()  # a cluster of its own: the session's shared one is stopped (the next module starts it again)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    nodes = [cluster.add_node(**ENGINE) for _ in range(engine_nodes)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="grpo_dist_tests")
    trainer = TrainingRun(load_config(None, [*RUN, f"trainer.steps={steps}", f"trainer.output_dir={tmp_path}"]),
                      tmp_path / "run")
    removed: list[float] = []

    def remove_when_two_steps_are_done() -> None:
        while len(train_records(trainer.run_dir)) < 2:
            time.sleep(0.05)
        cluster.remove_node(engine_node_of_the_worker(trainer, nodes))
        removed.append(time.monotonic())

    remover = threading.Thread(target=remove_when_two_steps_are_done, daemon=True)
    remover.start()
    try:
        try:
            result: object = trainer.run()
        except ActorGone as gone:
            result = gone
        remover.join(timeout=60)
        return trainer, time.monotonic() - removed[0], result
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_dead_node_s_rollout_worker_is_placed_again_on_another_node_and_the_run_completes(tmp_path):
    steps = 12
    trainer, _, summary = run_and_remove_the_worker_node(tmp_path, engine_nodes=2, steps=steps)
    assert isinstance(summary, dict), summary
    records = train_records(trainer.run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert summary["rollout_restarts"] >= 1 and summary["steps"] == steps
    assert all(r["weights/verified_version"] >= r["step"] - 1 for r in records)  # the new node's engine too


def test_a_dead_node_whose_worker_fits_nowhere_else_stops_the_run_within_the_start_timeout(tmp_path):
    trainer, took, error = run_and_remove_the_worker_node(tmp_path, engine_nodes=1, steps=1000)
    assert isinstance(error, ActorGone), error
    assert "rollout worker 0 was not back within 60 s" in str(error) and "cluster.actor_start_timeout_s" in str(error)
    assert took < 60 + 30, took
    assert trainer.checkpointer.saved is not None and (trainer.checkpointer.saved[1] / "COMPLETE").is_file()
