"""Which Ray cluster a run uses, and joining or starting it (launch and eval both come here).

A run joins a running cluster when one answers (RAY_ADDRESS, else the address `ray start`
recorded) and otherwise starts a local one, sized to what the run asks for and listening on
the loopback address only. Nothing here imports ray until `connect_ray` runs.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from grpo_dist.config.schema import Config
from grpo_dist.controller.errors import StartError
from grpo_dist.controller.placement import check_capacity, required_resources

PROBE_TIMEOUT_S = 2.0

# The local cluster's Ray settings: every result and argument, however small, goes to the object
# store (pipeline.py says why the driver must hold references only). A joined cluster has its own
# settings: there the rollout and reward actors get this one in their runtime environment
# (actors.BY_REFERENCE), which costs each a worker process of its own, started when it is created,
# where on a local cluster it takes one that Ray started ahead (benchmarks/actor_start.py: 2x).
LOCAL_SYSTEM_CONFIG = {"max_direct_call_object_size": 0}


def ray_address_file() -> Path:
    """Where `ray start` records the running cluster's address (Ray's rule, read without importing ray)."""
    root = os.environ.get("RAY_TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    return Path(root) / "ray" / "ray_current_cluster"


def probe_ray(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a Ray cluster answers at `host:port` (its GCS) or `ray://host:port` (its client
    server) within the timeout; otherwise what went wrong, in words.

    A TCP connect is not enough: a proxy or another server may hold the port, and ray.init
    then retries for minutes. This asks one gRPC question of the service Ray runs there; an
    answer "authentication token missing" is Ray's too (token auth is on by default).
    """
    import grpc  # with ray[default]; importing it does not import ray

    client = address.startswith("ray://")
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise StartError(f"Ray address {address!r} is not host:port or ray://host:port")
    method = "/ray.rpc.RayletDriver/ClusterInfo" if client else "/ray.rpc.NodeInfoGcsService/GetClusterId"
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
        try:
            call(b"", timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return None
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return f"nothing answers there within {timeout_s:.0f} s"
            return f"what answers there is not a Ray {'client server' if client else 'GCS'} ({exc.code().name})"
    return None


def running_cluster() -> tuple[str, str] | None:
    """The address of "the running cluster" and where it was found: RAY_ADDRESS, else `ray start`'s file."""
    if os.environ.get("RAY_ADDRESS", "auto") != "auto":
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    file = ray_address_file()
    recorded = file.read_text().strip() if file.is_file() else ""
    return (recorded, str(file)) if recorded else None


def choose_cluster(address: str | None) -> str | None:
    """The address to join, or None to start a local cluster; StartError when a required one is down.

    null: the running cluster if it answers within PROBE_TIMEOUT_S, else a local one (one line
    says so); 'local': a local one; 'auto': the running cluster, which must answer; else that
    address, which must answer. RAY_ADDRESS counts as given explicitly. Unlike
    ray.init(address="auto"), a cluster that another driver started for itself is never joined.
    """
    if address == "local":
        return None
    if address not in (None, "auto"):
        return require_ray(address, "cluster.address")
    found = running_cluster()
    if found is None and address == "auto":
        raise StartError(f"cluster.address=auto: no running Ray cluster (RAY_ADDRESS is unset and "
                         f"{ray_address_file()} does not exist); start one with `ray start --head`")
    if found is None or found[0] == "local":
        return None
    recorded, source = found
    if address == "auto" or source == "RAY_ADDRESS":
        return require_ray(recorded, source)
    problem = probe_ray(recorded)
    if problem is not None:
        print(f"the Ray cluster recorded in {source} ({recorded}) is gone: {problem}; starting a local cluster",
              file=sys.stderr)
        return None
    return recorded


def require_ray(address: str, source: str) -> str:
    problem = probe_ray(address)
    if problem is not None:
        raise StartError(f"Ray address {address} (from {source}): {problem}; start that cluster, or set "
                         "cluster.address=local")
    return address


def ray_environment(join: str | None) -> None:
    """The environment Ray reads when it is first imported (connect_ray says why); launch sets
    it before anything else may import ray."""
    if join is None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def connect_ray(config: Config, join: str | None) -> None:
    """Join the cluster at `join` (choose_cluster's answer, asked first: a dead address costs
    seconds, not the imports before this), or with None start a local one that listens on
    127.0.0.1 only, with the dashboard when cluster.dashboard asks and its packages are
    installed (its URL is printed);
    then StartError, within seconds, when the cluster cannot hold the run's actors at all.

    A local cluster gets cluster.num_cpus logical CPUs, or when that is not set as many as the
    run's actors reserve (at least the machine's cores): Ray's CPUs are a scheduling count, and
    a 2-core machine runs two learner ranks beside the engines, only slower.

    Ray takes the interface address as the node IP on Linux, also for `_node_ip_address=
    "127.0.0.1"`, unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which it reads into a constant
    when it is imported: both are set here, so it holds whatever imported ray first (the
    driver), and for every process the cluster starts (they inherit the environment). Ray's
    token authentication stays as Ray sets it.
    """
    ray_environment(join)
    import ray
    from ray._private import ray_constants

    common = {"namespace": config.cluster.namespace, "log_to_driver": True}
    if join is None:  # the dashboard (and the Jobs API) only when asked: a local run does without them
        ray_constants.ENABLE_RAY_CLUSTER = False
        cpus = config.cluster.num_cpus or max(os.cpu_count() or 1, math.ceil(required_resources(config)["CPU"]))
        # (a copy: Ray adds its spilling settings, this session's folder among them, to the dict it gets)
        context = ray.init(address="local", num_cpus=cpus, include_dashboard=config.cluster.dashboard,
                           dashboard_host="127.0.0.1", _system_config=dict(LOCAL_SYSTEM_CONFIG), **common)
        if context.dashboard_url:
            print(f"Ray dashboard: http://{context.dashboard_url}", file=sys.stderr)
    else:
        ray.init(address=join, **common)
        print(f"joined the Ray cluster at {join}", file=sys.stderr)
    try:
        check_capacity(config, ray.cluster_resources())
    except StartError:
        shutdown_ray()
        raise


def passes_by_reference() -> bool:
    """Whether the connected cluster is a local one started with LOCAL_SYSTEM_CONFIG (by
    `connect_ray`): then every process of it already returns its results through the object store.
    (A joined cluster's settings are not known to the driver: False.)"""
    import ray

    node = ray._private.worker._global_node
    return node is not None and all(node._config.get(key) == value for key, value in LOCAL_SYSTEM_CONFIG.items())


def shutdown_ray() -> None:
    """ray.shutdown, without the second it spends on a local cluster's autoscaler monitor.

    ray.shutdown stops the processes this driver started (none when it joined a cluster) with
    SIGTERM, giving each up to 1 s to exit. The autoscaler's monitor, of no use to a one-node
    cluster and holding no state, does not exit in that second (measured: 1.02 s of a 1.21 s
    shutdown), so it is killed outright first. Nothing to do where ray was never imported.
    """
    if "ray" not in sys.modules:
        return
    import ray

    node = ray._private.worker._global_node  # None when Ray is not initialized
    if node is not None:
        node.kill_monitor(check_alive=False)  # a no-op for a joined cluster: its monitor is not ours
    ray.shutdown()
