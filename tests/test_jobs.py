"""Ray Jobs: the README's `ray job submit --working-dir . -- python -m grpo_dist.launch ...` line
against a real `ray start --head` on 127.0.0.1 with the dashboard on.

The head runs with --block in a process group of its own, on ports chosen here, and with its
own RAY_TMPDIR, so that its address file never replaces another cluster's
/tmp/ray/ray_current_cluster; the test stops that process group and nothing else (never
`ray stop`). No PYTHONPATH reaches the cluster: the job imports grpo_dist from the uploaded
working directory.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for probe in sockets:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in sockets]
    for probe in sockets:
        probe.close()
    return ports


def wait_for_dashboard(url: str, head: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert head.poll() is None, "ray start --head exited"
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=5).close()
            return
        except urllib.error.HTTPError:  # it answers (401 without Ray's auth token): it is up
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"no dashboard at {url} after {timeout_s:.0f} s")


@pytest.fixture
def head(tmp_path):
    """A one-node cluster of 2 CPUs on 127.0.0.1; yields (dashboard URL, environment for the CLI)."""
    gcs, dashboard, client, agent = free_ports(4)
    temp = Path(f"/tmp/grpo_jobs_{gcs}")  # short: Ray's socket paths live under it
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "RAY_ADDRESS")}
    env.pop("RAY_AUTH_MODE", None)  # the README's command line sets it, as a user's would
    env.update(RAY_TMPDIR=str(temp), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PATH=f"{BIN}:{env['PATH']}")
    log = (tmp_path / "head.log").open("w")
    process = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs}", "--node-ip-address=127.0.0.1",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}", "--num-cpus=2"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # setsid: a group of its own
    )
    url = f"http://127.0.0.1:{dashboard}"
    try:
        wait_for_dashboard(url, process)
        yield url, env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        time.sleep(2)  # let the group's last processes go before their files do
        shutil.rmtree(temp, ignore_errors=True)
        log.close()


def readme_job_line() -> str:
    """The `ray job submit` line of the README's "On a cluster" section, as written."""
    [line] = re.findall(r"^.*ray job submit .*$", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    return line


@pytest.mark.slow
def test_the_readmes_ray_job_submit_line_trains_on_a_loopback_cluster(head, tmp_path):
    """The README's line, run as written from the repository's root, with HEAD replaced and
    overrides appended that fit the run on 2 CPUs and 2 steps."""
    url, env = head
    line = readme_job_line()
    assert "http://HEAD:8265" in line and line.startswith("RAY_AUTH_MODE=token ")
    overrides = ["rollout.engine=transformers", "rollout.num_workers=1", "rollout.num_cpus=0.5", "rollout.threads=1",
                 "reward.num_workers=1", "reward.num_cpus=0.25", "reward.processes=1", "learner.num_cpus=0.5",
                 "learner.threads=1", "rollout.prompts_per_step=8", "trainer.steps=2", "trainer.mode=async",
                 "trainer.eval_every=0", "data.eval_rows=8", "trainer.progress=false",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=job"]
    command = line.replace("http://HEAD:8265", url) + " " + " ".join(overrides)
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "succeeded" in result.stdout and "joined the Ray cluster at 127.0.0.1:" in result.stdout
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["mode"] == "async"
