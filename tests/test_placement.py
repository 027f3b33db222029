"""Rollout placement groups on a local two-node Ray cluster: pack shares a node, spread does not."""

import time

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import remove_placement_group

from grpo_dist.config import load_config
from grpo_dist.placement import in_bundle, rollout_placement_group


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="grpo_dist_tests")
    yield
    ray.shutdown()
    cluster.shutdown()


@ray.remote(num_cpus=0.5)
class Probe:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@pytest.mark.parametrize("placement,nodes", [("pack", 1), ("spread", 2)])
def test_rollout_bundles_follow_the_placement_strategy(two_nodes, placement, nodes):
    rollout = load_config(None, ["rollout.num_workers=2", "rollout.num_cpus=0.5",
                                 f"rollout.placement={placement}"]).rollout
    group = rollout_placement_group(rollout)
    assert group.wait(60), "both bundles fit on the cluster"
    probes = [Probe.options(scheduling_strategy=in_bundle(group, i)).remote() for i in range(2)]
    assert len(set(ray.get([p.node.remote() for p in probes]))) == nodes
    for probe in probes:
        ray.kill(probe)
    remove_placement_group(group)
    wait_for_free_cpus(2.0)  # else the next group sees one node taken


def wait_for_free_cpus(cpus: float, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < cpus:
        assert time.monotonic() < deadline, f"CPUs not released: {ray.available_resources()}"
        time.sleep(0.2)
