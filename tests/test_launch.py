"""launch as a user meets it: bad input is one message and exit 2 with nothing written; resumes are
checked before anything starts; a dead cluster address costs seconds, not minutes; the local
cluster listens on the loopback address only; secrets in the environment stay there."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from grpo_dist.controller.checkpoints import TrainerState, save_checkpoint
from grpo_dist.config.schema import load_config
from grpo_dist.controller.cluster import probe_ray, ray_address_file
from grpo_dist.launch import main, parse_args, plan_run
from grpo_dist.tasks.tiny import save_tiny_model

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {"WANDB_API_KEY": "wandb-secret-5f1c0e7a9d", "HF_TOKEN": "hf_secret_93b2d7c4e1"}
TINY_RUN = ["trainer.steps=1", "trainer.progress=false", "trainer.save_final=false", "rollout.engine=transformers",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.threads=1", "learner.threads=1",
            "data.eval_rows=2", "cluster.num_cpus=2"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_dist.launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def make_run(output_dir: Path, name: str = "run", *overrides: str) -> Path:
    """A run directory with one complete checkpoint (a stand-in for the learner's share)."""
    config = load_config(None, [f"trainer.output_dir={output_dir}", f"trainer.run_name={name}", *overrides])
    run_dir = output_dir / name
    state = TrainerState(step=3, policy_version=3, cursor={"seed": 0, "epoch": 0, "position": 96, "rows": 9000})
    save_checkpoint(run_dir, state, config, lambda folder: (folder / "learner.pt").write_bytes(b"w" * 64), keep=2)
    (run_dir / "config.yaml").write_text("the run's own files\n")
    return run_dir


def listing(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*")}


def test_a_resume_starts_from_the_checkpoints_config_with_the_overrides_on_top(tmp_path):
    run_dir = make_run(tmp_path, "run", "algo.lr=0.003")
    plan = plan_run(parse_args(["--resume", str(run_dir), "trainer.steps=9"]))
    assert plan.run_dir == run_dir and plan.checkpoint.state.step == 3
    assert plan.config.algo.lr == 0.003 and plan.config.trainer.steps == 9

    newest = make_run(tmp_path, "newer")
    plan = plan_run(parse_args(["--resume", "auto", f"trainer.output_dir={tmp_path}"]))
    assert plan.run_dir == newest and plan.checkpoint.path.parent.parent == newest


def test_bad_input_is_one_message_exit_2_and_nothing_written(tmp_path):
    out = tmp_path / "out"
    result = launch("model.path=/nonexistent/model", f"trainer.output_dir={out}")
    assert result.returncode == 2 and "model.path = '/nonexistent/model': not a model folder" in result.stderr
    assert not out.exists()

    run_dir = make_run(out)
    before = listing(out)
    cases = {
        (f"trainer.output_dir={out}", "trainer.run_name=run"): f"run directory {run_dir} already holds a run",
        ("--resume", str(run_dir), "algo.lr=0.5"): "cannot resume with a different algo.lr",
        ("--resume", str(run_dir), "rollout.group_size=4"): "cannot resume with a different rollout.group_size",
        ("--resume", "auto", f"trainer.output_dir={tmp_path / 'empty'}"): "no run in",
        ("--resume", str(tmp_path / "nothing")): "no checkpoint in",
    }
    for args, message in cases.items():
        result = launch(*args)
        assert (result.returncode, result.stderr.count("\n")) == (2, 1), (args, result.stderr)
        assert result.stderr.startswith("error: ") and message in result.stderr, (args, result.stderr)
    (run_dir / "checkpoints" / "step_000003" / "learner.pt").write_bytes(b"torn")
    result = launch("--resume", str(run_dir))
    assert result.returncode == 2 and "step_000003 is incomplete: learner.pt is 4" in result.stderr
    assert listing(out) == {**before, "run/checkpoints/step_000003/learner.pt": listing(out)[
        "run/checkpoints/step_000003/learner.pt"]}  # only the file this test tore
    assert not (tmp_path / "empty").exists() and not (tmp_path / "nothing").exists()



def resume_in_process(capsys, run_dir: Path, *overrides: str) -> tuple[int, str]:
    """The launcher's own main() on `--resume run_dir --print-config overrides`: the resume is
    planned and guarded as a real one is, then the config is printed instead of run."""
    code = main(["--resume", str(run_dir), "--print-config", *overrides])
    captured = capsys.readouterr()
    return code, captured.err if code else captured.out


def test_the_resume_guard_refuses_every_field_that_decides_what_is_trained(tmp_path, capsys):
    """Each change is exit 2 with one line naming the field; the checkpoint's config is left as it
    was, on disk and as loaded (an override once wrote into the dict it was compared with)."""
    other_model = tmp_path / "other_model"
    save_tiny_model(other_model, "llama")
    lora = make_run(tmp_path, "lora", "learner.lora={rank: 4, alpha: 8}")
    plain = make_run(tmp_path, "plain")
    saved = {run: (run / "checkpoints" / "step_000003" / "config.yaml").read_text() for run in (lora, plain)}
    capsys.readouterr()  # the model's save printed a progress bar
    cases = [
        (lora, ["learner.lora.alpha=32"], "learner.lora.alpha"),
        (lora, ["learner.lora.rank=8"], "learner.lora.rank"),
        (lora, ["learner.lora=null"], "learner.lora"),
        (plain, ["learner.lora={rank: 4}"], "learner.lora"),
        (plain, [f"model.path={other_model}"], "model.path"),
        (plain, ["algo.lr=0.5"], "algo.lr"),
        (plain, ["algo.beta=0.1"], "algo.beta"),
        (plain, ["rollout.group_size=4"], "rollout.group_size"),
        (plain, ["learner.sharding=fsdp", "learner.num_ranks=2"], "learner.sharding"),
        (plain, ["reward.functions.0.weight=2"], "reward.functions"),
    ]
    for run_dir, overrides, field in cases:
        code, err = resume_in_process(capsys, run_dir, *overrides)
        assert (code, err.count("\n")) == (2, 1), (overrides, err)
        assert err.startswith(f"error: cannot resume with a different {field} ("), (overrides, err)
        plan = plan_run(parse_args(["--resume", str(run_dir)]))  # a plain resume still passes the guard
        assert plan.checkpoint.config == load_config(None, [
            f"trainer.output_dir={tmp_path}", f"trainer.run_name={run_dir.name}",
            *(["learner.lora={rank: 4, alpha: 8}"] if run_dir == lora else [])]).model_dump(mode="json")
    assert {run: (run / "checkpoints" / "step_000003" / "config.yaml").read_text() for run in saved} == saved

    # the same door as a user meets it: `python -m grpo_dist.launch --resume RUN learner.lora.alpha=32`
    result = launch("--resume", str(lora), "learner.lora.alpha=32")
    assert result.returncode == 2 and result.stderr.startswith("error: cannot resume with a different "
                                                               "learner.lora.alpha (learner.lora.alpha: 8.0 in the "
                                                               "checkpoint, 32.0 now)"), result.stderr


def test_a_resume_may_change_how_long_what_is_logged_deadlines_and_placement(tmp_path, capsys):
    run_dir = make_run(tmp_path, "run")
    fsdp = make_run(tmp_path, "fsdp", "learner.sharding=fsdp", "learner.num_ranks=2")
    allowed = ["trainer.steps=9", "trainer.loggers=[jsonl]", "trainer.progress=false", "trainer.samples_every=1",
               "trainer.call_timeout_s=60", "trainer.weight_sync_timeout_s=60", "learner.threads=1",
               "learner.micro_batch_size=4", "rollout.num_workers=2", "trainer.eval_every=0"]
    code, out = resume_in_process(capsys, run_dir, *allowed)
    assert code == 0, out
    assert "steps: 9" in out and "call_timeout_s: 60.0" in out and "micro_batch_size: 4" in out
    code, out = resume_in_process(capsys, fsdp, "learner.offload=all", "learner.num_ranks=3")
    assert code == 0 and "offload: all" in out, out


@pytest.mark.slow  # two clusters started, tens of seconds
def test_a_local_cluster_fits_the_run_and_one_that_cannot_is_exit_2_in_one_line(tmp_path):
    """Four learner ranks on a 2-core machine: the cluster connect_ray starts itself gets the
    logical CPUs the run reserves (it waited cluster.actor_start_timeout_s, then dumped Ray's
    bundles); a cluster held to fewer CPUs than the actors reserve is refused at once."""
    sized = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import ray
        from grpo_dist.controller.cluster import connect_ray
        from grpo_dist.config.schema import load_config
        connect_ray(load_config(None, ["learner.num_ranks=4", "learner.num_cpus=1"]), None)
        print("CPUs", ray.cluster_resources()["CPU"])
        ray.shutdown()
    """)], capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    reserved = 0.5 + 0.25 + 4 * 1  # the default rollout worker and reward actor, four ranks
    assert f"CPUs {max(os.cpu_count(), math.ceil(reserved)):.1f}" in sized.stdout, sized.stdout + sized.stderr
    started = time.monotonic()
    result = launch("cluster.address=local", "cluster.num_cpus=1", "learner.num_ranks=2",
                    f"trainer.output_dir={tmp_path}")
    assert time.monotonic() - started < 60
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the cluster cannot hold this run") and "learner 2 x {'CPU': 1.0}" in last
    assert not (tmp_path / "run").exists() and not any(tmp_path.iterdir())


def test_a_dead_explicit_address_is_exit_2_within_seconds(tmp_path):
    for address, problem in ((f"127.0.0.1:{free_port()}", "nothing answers there"),
                             (f"ray://127.0.0.1:{free_port()}", "nothing answers there"),
                             ("not-an-address", "is not host:port")):
        started = time.monotonic()
        result = launch("--address", address, f"trainer.output_dir={tmp_path}")
        assert time.monotonic() - started < 15
        assert result.returncode == 2 and problem in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_printed_config_holds_no_secret_from_the_environment():
    result = launch("--print-config", env=SECRETS)
    assert result.returncode == 0 and "trainer:" in result.stdout
    for secret in SECRETS.values():
        assert secret not in result.stdout + result.stderr


def test_the_address_file_is_where_ray_looks(monkeypatch, tmp_path):
    from ray._common.utils import get_ray_address_file

    for env in ({}, {"TMPDIR": str(tmp_path)}, {"TMPDIR": "/elsewhere", "RAY_TMPDIR": str(tmp_path / "r")}):
        monkeypatch.delenv("TMPDIR", raising=False)
        monkeypatch.delenv("RAY_TMPDIR", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert str(ray_address_file()) == get_ray_address_file(None)


LISTENERS = textwrap.dedent("""
    import json, psutil
    import ray  # first, as the real launcher imports it (Ray reads how to bind when it is imported)
    from grpo_dist.controller.cluster import connect_ray
    from grpo_dist.config.schema import load_config
    connect_ray(load_config(None, ["cluster.address=local", "cluster.num_cpus=2"]), None)

    @ray.remote(num_cpus=0)
    def ping():
        return 1

    ray.get(ping.remote())
    own = {p.pid for p in psutil.Process().children(recursive=True)} | {psutil.Process().pid}
    print(json.dumps(sorted({(c.laddr.ip, psutil.Process(c.pid).name()) for c in psutil.net_connections("inet")
                             if c.status == psutil.CONN_LISTEN and c.pid in own})))
""")


def test_the_local_cluster_listens_on_the_loopback_address_only():
    result = subprocess.run([sys.executable, "-c", LISTENERS], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    listeners = json.loads(result.stdout.strip().splitlines()[-1])
    assert {name for _, name in listeners} >= {"gcs_server", "raylet"}, listeners
    assert {ip for ip, _ in listeners} <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, listeners


STOP = textwrap.dedent("""
    import json, psutil, ray
    from grpo_dist.controller.cluster import connect_ray, shutdown_ray
    from grpo_dist.config.schema import load_config
    config = load_config(None, ["cluster.address=local", "cluster.num_cpus=2"])
    for attempt in range(2):  # a second cluster in the same process: it starts as the first did
        connect_ray(config, None)
        ours = {kind: [info.process.pid for info in infos]
                for kind, infos in ray._private.worker._global_node.all_processes.items()}
        shutdown_ray()
        alive = {kind: [pid for pid in pids if psutil.pid_exists(pid)
                        and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE] for kind, pids in ours.items()}
        print(json.dumps({"kinds": sorted(ours), "alive": {k: v for k, v in alive.items() if v},
                          "initialized": ray.is_initialized()}))
""")


def test_shutting_down_a_local_cluster_stops_every_process_it_started_the_monitor_too():
    """shutdown_ray kills the autoscaler's monitor outright before ray.shutdown (which would wait a
    second on it): every process of the cluster is gone after it, and a new cluster starts."""
    result = subprocess.run([sys.executable, "-c", STOP], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(line) for line in result.stdout.strip().splitlines()[-2:]]
    for report in reports:
        assert {"gcs_server", "raylet", "monitor"} <= set(report["kinds"]), report
        assert report["alive"] == {} and not report["initialized"], report


@pytest.mark.slow
def test_the_real_command_listens_on_the_loopback_address_only_while_it_trains(tmp_path):
    """`python -m grpo_dist.launch` as users run it (data preparation imports ray before connect_ray):
    every listening socket of its process tree, taken while it trains."""
    import psutil
    from faults import kill_session
    from runs import SMALL, start, train_records, wait_for

    run = start(*SMALL, "trainer.steps=400", f"trainer.output_dir={tmp_path}", "trainer.run_name=run",
                log=tmp_path / "log")
    try:
        wait_for(lambda: len(train_records(tmp_path / "run")) >= 2, run, timeout=240)
        tree = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
        own = {process.pid: process.name() for process in tree}
        listeners = {(c.laddr.ip, own[c.pid]) for c in psutil.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in own}
    finally:
        kill_session(run.pid)
        run.wait(timeout=30)
    assert {name for _, name in listeners} >= {"gcs_server", "raylet"}, listeners
    assert {ip for ip, _ in listeners} <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, listeners


@pytest.fixture
def dead_head():
    """A `ray start --head` cluster killed with -9, its address file left behind.

    It lives under its own RAY_TMPDIR (short: Ray's socket paths must fit 107 bytes), so the
    machine's /tmp/ray/ray_current_cluster, which other Ray users read, is never touched.
    """
    temp = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))
    env = {**os.environ, "RAY_TMPDIR": str(temp)}
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={free_port()}",
                             "--num-cpus=1", "--include-dashboard=false", "--block"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        address_file = temp / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 120
        while probe_ray(address_file.read_text().strip() if address_file.is_file() else "x:1") is not None:
            assert time.monotonic() < deadline and head.poll() is None, "the head did not come up"
            time.sleep(0.5)
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
        yield env, address_file.read_text().strip()
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(temp)], check=False)


@pytest.mark.slow
def test_a_dead_recorded_cluster_costs_seconds_and_the_run_dir_holds_no_secret(dead_head, tmp_path):
    # measured before this check: `launch` retried the dead address for minutes ("Failed to connect to GCS")
    env, address = dead_head
    assert "nothing answers" in probe_ray(address)
    started = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "grpo_dist.launch", *TINY_RUN, f"trainer.output_dir={tmp_path}",
                            "trainer.run_name=run"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env={**env, "PYTHONPATH": str(ROOT), **SECRETS})
    lines = []
    for line in run.stdout:
        lines.append(line)
        if "is gone" in line:
            assert time.monotonic() - started < 10, "".join(lines)
            assert address in line and "starting a local cluster" in line
    assert run.wait(timeout=300) == 0, "".join(lines[-50:])
    assert any("is gone" in line for line in lines)
    # the last words are the summary, flushed before the process ends without the interpreter's
    # finalization, and nothing follows it (gc.freeze() had nanobind report "leaked" objects)
    assert lines[-1].rstrip() == "}" and not any("leaked" in line for line in lines), "".join(lines[-20:])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1
    # the timeline: the start's phases add up to the first optimizer step, the end's to the exit
    timeline = summary["timeline"]
    assert {"ray_start_beside_data", "actors", "eval_before", "first_step"} <= set(timeline["start_s"])
    assert {"eval_after", "stop_actors", "ray_shutdown"} <= set(timeline["end_s"])
    assert set(timeline["actor_ready_s"]) == {"rollout worker 0", "reward actor 0", "learner"}
    first, exit_s = timeline["first_optimizer_step_s"], timeline["exit_s"]
    assert sum(timeline["start_s"].values()) == pytest.approx(first, abs=1.0)
    assert timeline["final_eval_done_s"] + sum(timeline["end_s"].values()) - timeline["end_s"]["eval_after"] \
        - timeline["end_s"].get("checkpoint", 0.0) == pytest.approx(exit_s, abs=1.0)
    assert first < timeline["final_eval_done_s"] < exit_s <= time.monotonic() - started + 1.0
    assert any(line.startswith("start: ") for line in lines) and any(line.startswith("end: ") for line in lines)
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert not any(secret.encode() in content for secret in SECRETS.values()), path
