"""Shared fixtures: one real local Ray cluster shared by the modules that use it; the test tiers.

Every test is in one tier, named by a marker that says what it costs:

    unit   no Ray cluster: pure functions, actors' classes called directly, sandboxes, seconds each
    ray    a real Ray cluster (a fixture in CLUSTERS, or marked by hand where a subprocess starts
           one), real engines and actors
    slow   end-to-end training runs, minutes each (marked by hand)

`pytest -m "not slow"` (the README's test command) runs unit and ray; `pytest` runs all three.
"""

import os
import sys
import time
import warnings
from pathlib import Path

import pytest
import ray

from grpo_dist.config.schema import Config, load_config, vllm_installed
from grpo_dist.controller.cluster import shutdown_ray

TESTS = Path(__file__).resolve().parent
SCRIPTS = TESTS.parent / "scripts"

# Rollout engines to test: vLLM only where it is installed (scripts/setup_env.sh installs it).
ENGINES = [
    "transformers",
    pytest.param("vllm", marks=pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")),
]


# Fixtures that start a Ray cluster for their tests.
CLUSTERS = {"ray_cluster", "two_nodes", "head", "dead_head"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test that is neither slow nor ray by hand: ray when it uses a cluster fixture, else unit.
    The modules that share the session's cluster (ray_cluster) run last, one after another, each
    module's tests in their order: the cluster starts once, and no other module runs beside it."""
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("ray") is None:
            item.add_marker(pytest.mark.ray if CLUSTERS & set(item.fixturenames) else pytest.mark.unit)
    sharing = sharing_modules(items)
    items.sort(key=lambda item: module_name(item) in sharing)  # a stable sort


def module_name(item: pytest.Item) -> str:
    return item.module.__name__ if isinstance(item, pytest.Function) else item.nodeid


def sharing_modules(items: list[pytest.Item]) -> set[str]:
    """The modules with a test that uses the shared cluster (ray_cluster)."""
    return {module_name(item) for item in items if "ray_cluster" in item.fixturenames}


SHARED_ONWARD: set[str] = set()  # the modules whose next module takes the shared cluster over


def pytest_collection_finish(session: pytest.Session) -> None:
    """After every deselection: which module hands the cluster to the next one."""
    order = list(dict.fromkeys(module_name(item) for item in session.items))
    sharing = sharing_modules(session.items)
    SHARED_ONWARD.update(this for this, following in zip(order, order[1:]) if following in sharing)


def cluster_leftovers(timeout_s: float = 15.0) -> str | None:
    """None when the cluster looks fresh (its nodes alive, every actor dead, every resource free;
    waits up to `timeout_s` for kills to land), else what is left, in words. Objects still in the
    store do not count: a module's last results, freed once their references go, hold no actor."""
    deadline = time.monotonic() + timeout_s
    while True:
        dead_nodes = [n["NodeID"][:8] for n in ray.nodes() if not n["Alive"]]
        alive = [a["ActorClassName"] for a in ray._private.state.actors().values() if a["State"] != "DEAD"]
        free, total = ray.available_resources(), ray.cluster_resources()
        held = {k: round(v - free.get(k, 0.0), 3) for k, v in total.items()
                if free.get(k, 0.0) != v and k != "object_store_memory"}
        if not (dead_nodes or alive or held):
            return None
        if time.monotonic() > deadline:
            return f"dead nodes {dead_nodes}, live actors {alive}, resources held {held}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_cluster(request):
    """The session's local Ray cluster, started by the first module that needs it.

    Starting one per module cost seconds each; the next module gets it back if a fresh cluster
    looks so (no actor alive, every resource held free), else it starts anew; it is shut down
    after the last module that shares it (the next module, if any, does not).
    """
    if not ray.is_initialized():
        # The actors import the tests' helper modules as the driver does (rewards named "reward_helpers:...").
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
            ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="grpo_dist_tests")  # never another's
    yield
    if request.module.__name__ not in SHARED_ONWARD:
        shutdown_ray()
        return
    leftovers = cluster_leftovers()
    if leftovers is not None:
        warnings.warn(f"{request.module.__name__} left {leftovers}: the next module gets a new cluster")
        shutdown_ray()


@pytest.fixture
def ray_stopped():
    """No Ray in this process (the shared cluster shut down): for tests that check a command never starts it."""
    shutdown_ray()


@pytest.fixture
def agent_runner():
    """AgentRunner(...) closed when the test ends: an unclosed runner's spare host and endpoint
    would live on to the session's end (the fast tier kept 11 idle hosts, ~60 MB each)."""
    from grpo_dist.agent.runner import AgentRunner

    runners = []

    def start(*args, **kwargs) -> AgentRunner:
        runners.append(AgentRunner(*args, **kwargs))
        return runners[-1]

    yield start
    for runner in runners:
        runner.close()


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (scripts/real_model.py), prepared if missing.

    In CI (CI=true) a model that cannot be prepared is an error: the real-model tests must run there.
    """
    sys.path.insert(0, str(SCRIPTS))
    from real_model import PrepareError, prepare

    try:
        return prepare()
    except PrepareError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the real model could not be prepared in CI: {exc}")
        pytest.skip(f"the real model could not be prepared (scripts/real_model.py): {exc}")


def small_config(output_dir, *extra: str) -> Config:
    """The default task, scaled down to fit 2 CPUs with two rollout workers."""
    return load_config(None, [
        "rollout.num_workers=2", "rollout.num_cpus=0.5", "rollout.threads=1",
        "rollout.group_size=4", "rollout.prompts_per_step=8",
        "learner.num_cpus=0.5", "learner.threads=1", "reward.num_cpus=0.25",
        "rollout.vllm.cpu_kv_cache_gb=0.25",
        "algo.lr=1e-3",  # large enough that two steps surely move the weights
        f"trainer.output_dir={output_dir}", "trainer.run_name=run", "trainer.progress=false",
        "data.eval_rows=32", *extra,
    ])
