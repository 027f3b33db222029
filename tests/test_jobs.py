"""Ray Jobs: `ray job submit --working-dir . -- python -m grpo_dist.launch ...` against a real
`ray start --head` on 127.0.0.1 with the dashboard on.

The head runs with --block in a process group of its own, on ports chosen here, and with its
own RAY_TMPDIR, so that its address file never replaces another cluster's
/tmp/ray/ray_current_cluster; the test stops that process group and nothing else (never
`ray stop`). No PYTHONPATH reaches the cluster: the job imports grpo_dist from the uploaded
working directory.
"""

import json
import os
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
    # RAY_AUTH_MODE=token: the job CLI then sends the token `ray start` uses (~/.ray/auth_token)
    env.update(RAY_TMPDIR=str(temp), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
               PATH=f"{BIN}:{env['PATH']}")
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


@pytest.mark.slow
def test_ray_job_submit_trains_on_a_loopback_cluster(head, tmp_path):
    url, env = head
    result = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", url, "--working-dir", str(ROOT), "--",
         "python", "-m", "grpo_dist.launch", "rollout.engine=transformers", "trainer.steps=2", "trainer.mode=async",
         "trainer.eval_every=0", "data.eval_rows=8", "trainer.progress=false", f"trainer.output_dir={tmp_path}",
         "trainer.run_name=job"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "succeeded" in result.stdout and "joined the Ray cluster at 127.0.0.1:" in result.stdout
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["mode"] == "async"
