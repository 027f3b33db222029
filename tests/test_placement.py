"""Placement of every actor kind on a simulated two-node Ray cluster (ray.cluster_utils.Cluster).

The "engines" node offers a custom resource and a label that the rollout workers ask for;
the "trainer" node offers others that the learner and the reward actors ask for; it also
has one (simulated) GPU, which a learner and an engine asking for half a GPU each share.
"""

import json
import time

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table, remove_placement_group

from grpo_dist.config.schema import load_config
from grpo_dist.controller.cluster import shutdown_ray
from grpo_dist.observe.metrics import MetricsLog
from grpo_dist.controller.placement import Role, create_placement_group, in_bundle, roles
from grpo_dist.controller.actors import Actors
from grpo_dist.controller.run import TrainingRun

ENGINES = {"num_cpus": 2, "resources": {"engine_node": 4}, "labels": {"pool": "engines"}}
TRAINER = {"num_cpus": 2, "num_gpus": 1, "resources": {"trainer_node": 4}, "labels": {"pool": "trainer"}}
PINNED = ["rollout.resources={engine_node: 1}", "reward.node_labels={pool: trainer}",
          "learner.resources={trainer_node: 1}"]


@pytest.fixture(scope="module")
def two_nodes():
    shutdown_ray()  # a cluster of its own: the session's shared one is stopped (the next module starts it again)
    cluster = Cluster(initialize_head=True, head_node_args=ENGINES)
    trainer_node = cluster.add_node(**TRAINER)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="grpo_dist_tests")
    yield {"engines": cluster.head_node.node_id, "trainer": trainer_node.node_id}
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0.5)
class Probe:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def test_roles_come_from_the_config_sections():
    config = load_config(None, ["rollout.num_workers=3", "rollout.placement=spread", "rollout.num_gpus=0.5",
                                "reward.num_workers=2", "reward.num_cpus=0", "reward.resources={sandbox: 1}",
                                "learner.node_labels={pool: gpu}"])
    rollout, reward, learner = roles(config)
    assert (rollout.count, rollout.strategy, rollout.bundle()) == (3, "spread", {"CPU": 0.5, "GPU": 0.5})
    assert (reward.count, reward.bundle()) == (2, {"sandbox": 1})  # zero amounts are left out
    assert (learner.count, learner.bundle(), learner.labels) == (1, {"CPU": 1.0}, {"pool": "gpu"})


@pytest.mark.parametrize("strategy,nodes", [("pack", 1), ("spread", 2)])
def test_bundles_follow_the_placement_strategy(two_nodes, strategy, nodes):
    group = create_placement_group(Role("probe", 2, 0.5, 0.0, strategy=strategy))
    assert group.wait(60), "both bundles fit on the cluster"
    probes = [Probe.options(scheduling_strategy=in_bundle(group, i)).remote() for i in range(2)]
    assert len(set(ray.get([p.node.remote() for p in probes]))) == nodes
    for probe in probes:
        ray.kill(probe)
    remove_placement_group(group)
    wait_for_free_cpus(4.0)  # else the next group sees one node taken


def test_labels_pin_a_role_to_the_nodes_that_carry_them(two_nodes):
    group = create_placement_group(Role("probe", 2, 0.5, 0.0, labels={"pool": "trainer"}, strategy="spread"))
    assert group.wait(60)
    assert set(placement_group_table(group)["bundles_to_node_id"].values()) == {two_nodes["trainer"]}
    remove_placement_group(group)
    wait_for_free_cpus(4.0)


def test_a_learner_and_an_engine_share_a_gpu_by_asking_for_half_each(two_nodes, tmp_path):
    config = load_config(None, [*PINNED, "rollout.resources={trainer_node: 1}", "rollout.engine=transformers",
                                "rollout.num_gpus=0.5", "learner.num_gpus=0.5", "rollout.num_cpus=0.5",
                                "learner.num_cpus=0.5", f"trainer.output_dir={tmp_path}"])
    actors = Actors.start(config)
    try:
        placed = [actors.rollouts[0], actors.learner]
        nodes = ray.get([a.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()) for a in placed])
        gpus = ray.get([a.__ray_call__.remote(lambda _: ray.get_gpu_ids()) for a in placed])
        assert nodes == [two_nodes["trainer"]] * 2 and gpus[0] == gpus[1] and len(gpus[0]) == 1
    finally:
        actors.stop()
    wait_for_free_cpus(4.0)


def test_actors_that_cannot_be_placed_end_in_one_message_naming_the_role(two_nodes, tmp_path):
    from grpo_dist.controller.errors import NotPlaced

    config = load_config(None, ["rollout.node_labels={pool: nowhere}", "rollout.engine=transformers",
                                "cluster.actor_start_timeout_s=3", f"trainer.output_dir={tmp_path}"])
    started = time.monotonic()
    with pytest.raises(NotPlaced) as raised:
        Actors.start(config)
    message = str(raised.value)
    assert time.monotonic() - started < 60 and "\n" not in message
    assert message.startswith("rollout worker 0: start") and "not done after 3 s (cluster.actor_start_timeout_s)" in message
    assert "placement groups not placed: rollout;" in message and "node_labels" in message  # the others were placed
    wait_for_free_cpus(4.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_places_every_role_where_configured(two_nodes, tmp_path, mode):
    config = load_config(None, [
        *PINNED, "rollout.num_workers=2", "rollout.engine=transformers", "rollout.num_cpus=0.5", "rollout.threads=1",
        "rollout.group_size=4", "rollout.prompts_per_step=8", "rollout.chunk_prompts=2", "reward.num_workers=2",
        "learner.num_cpus=0.5", "learner.threads=1", "algo.lr=1e-3", "data.eval_rows=8",
        f"trainer.mode={mode}", "trainer.steps=3", "trainer.eval_every=0", "trainer.save_final=false",
        "trainer.progress=false", "trainer.loggers=[jsonl]", f"trainer.output_dir={tmp_path}",
    ])
    trainer = TrainingRun(config, tmp_path / mode)
    trainer.start()
    try:
        where = {
            "rollout": [d["node_id"] for d in ray.get([w.describe.remote() for w in trainer.actors.rollouts])],
            "reward": ray.get([r.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
                               for r in trainer.actors.rewards]),
            "learner": [ray.get(trainer.actors.learner.__ray_call__.remote(
                lambda _: ray.get_runtime_context().get_node_id()))],
        }
        assert where == {"rollout": [two_nodes["engines"]] * 2, "reward": [two_nodes["trainer"]] * 2,
                         "learner": [two_nodes["trainer"]]}
        trainer.verify_weights()
        (tmp_path / mode).mkdir()
        log = MetricsLog(tmp_path / mode, config)
        assert trainer.loop.train(log, time.time()) == 3  # every push's checksums are checked
        log.close()
        trainer.verify_weights()  # every engine serves the learner's final weights
        learner_checksum = ray.get(trainer.actors.learner.checksum.remote())
        assert ray.get([w.checksum.remote() for w in trainer.actors.rollouts]) == [learner_checksum] * 2
    finally:
        trainer.stop()
    records = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy/version"] for r in records] == [1.0, 2.0, 3.0]
    lags = [r["rollout/staleness_max"] for r in records]
    assert lags == ([0.0, 0.0, 0.0] if mode == "sync" else [0.0, 1.0, 1.0])
    wait_for_free_cpus(4.0)


def wait_for_free_cpus(cpus: float, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < cpus:
        assert time.monotonic() < deadline, f"CPUs not released: {ray.available_resources()}"
        time.sleep(0.2)


def test_what_a_run_reserves_and_whether_a_cluster_holds_it():
    from grpo_dist.controller.errors import StartError
    from grpo_dist.controller.placement import check_capacity, required_resources

    config = load_config(None, ["rollout.num_workers=2", "rollout.num_cpus=1.5", "reward.num_workers=3",
                                "reward.num_cpus=0.5", "learner.num_ranks=2", "learner.num_cpus=1",
                                "learner.num_gpus=1", "learner.resources={trainer_node: 1}"])
    assert required_resources(config) == {"CPU": 2 * 1.5 + 3 * 0.5 + 2 * 1, "GPU": 2.0, "trainer_node": 2.0}
    check_capacity(config, {"CPU": 6.5, "GPU": 2.0, "trainer_node": 2.0})
    with pytest.raises(StartError) as short:
        check_capacity(config, {"CPU": 6.0, "GPU": 2.0, "trainer_node": 1.0})
    message = str(short.value)
    assert "\n" not in message and "CPU 6.5 (the cluster has 6)" in message and "trainer_node 2" in message
    assert "GPU" not in message.split(";")[0] and "learner 2 x" in message and "rollout 2 x {'CPU': 1.5}" in message
