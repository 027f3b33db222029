"""Soak: the default job for many steps in async mode with 2 rollout workers and 2 reward actors,
watching every process's resident memory and open file descriptors.

    python benchmarks/soak.py [--steps 1000] [--warmup 20] [--bound-mb 64] [--bound-fds 16] [-- extra overrides]

Runs `python -m grpo_dist.launch` in a session of its own (its local Ray cluster is made of the
driver's descendants), samples each process of that session once step `--warmup` is logged (the
start: imports, models and the first calls' buffers are in) and again once the last step is
logged (the end), then waits for the exit. Prints one row per process (Ray's title, or the
command): RSS and open fds at both points and their drift, the exit code, steps, faults (restarts,
retries, hangs), and what is left of the session after the exit (processes and listening ports).
Exit 1 when a process grew past a bound, something was left behind, or the run failed.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from faults import session_processes as session  # noqa: E402  (the tests' own: a run's processes)
from runs import train_records as logged_steps  # noqa: E402  (metrics.jsonl's complete train lines)

FAULTS = ("rollout/restarts", "rollout/retries", "rollout/hangs", "reward/restarts", "reward/retries", "reward/hangs")


def name_of(process: psutil.Process) -> str:
    """Ray's process title (ray::RolloutWorker...), else the command, shortened."""
    try:
        words = process.cmdline() or [process.name()]
    except psutil.Error:
        return "?"
    if words[0].startswith("ray::"):
        return words[0][:60]
    program = [w for w in words[:3] if not w.startswith("-")][-1]  # python's script, or the binary
    return " ".join([Path(program).name, *words[words.index(program) + 1:]])[:60]


def sample(leader: int) -> dict[int, tuple[str, float, int]]:
    """pid -> (name, RSS in MB, open fds) for every process of the session."""
    found = {}
    for process in session(leader):
        try:
            found[process.pid] = (name_of(process), process.memory_info().rss / 2**20, process.num_fds())
        except psutil.Error:
            pass
    return found


def wait_for_step(run: subprocess.Popen, run_dir: Path, step: int) -> None:
    while not any(r["step"] >= step for r in logged_steps(run_dir)):
        if run.poll() is not None:
            raise SystemExit(f"the run ended (exit {run.returncode}) before step {step}")
        time.sleep(0.5)


def listening_ports(pids: set[int] | None = None) -> set[int]:
    """The ports that `pids` (anyone: None) listen on."""
    return {c.laddr.port for c in psutil.net_connections("inet")
            if c.status == "LISTEN" and (pids is None or c.pid in pids)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=20, help="the step whose end is the start sample")
    parser.add_argument("--bound-mb", type=float, default=64.0, help="RSS growth allowed per process")
    parser.add_argument("--bound-fds", type=int, default=16, help="open-fd growth allowed per process")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="soak-"))
    command = [sys.executable, "-m", "grpo_dist.launch", "cluster.address=local", "trainer.mode=async",
               "rollout.num_workers=2", "reward.num_workers=2", "rollout.threads=1", "learner.threads=1",
               f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.progress=false",
               f"trainer.output_dir={out}", "trainer.run_name=soak", *args.overrides]
    print(" ".join(command[1:]), flush=True)
    log = open(out / "launch.log", "w")  # noqa: SIM115 (the child writes it)
    started = time.monotonic()
    run = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run_dir = out / "soak"
    try:
        wait_for_step(run, run_dir, args.warmup)
        first = sample(run.pid)
        wait_for_step(run, run_dir, args.steps)
        last = sample(run.pid)
        ports_used = listening_ports(set(last))
        code = run.wait(timeout=600)
        time.sleep(2)  # Ray's last children, reaped by the raylet's exit
        # what outlived the run: its session, and any of its processes that left the session
        left = session(run.pid) + [psutil.Process(pid) for pid in last if psutil.pid_exists(pid)]
        ports = sorted(listening_ports(set(last)))  # (another program may take a freed port: not counted)
    finally:
        for process in session(run.pid):
            process.send_signal(signal.SIGKILL)
    wall = time.monotonic() - started
    records = logged_steps(run_dir)
    faults = {name: sum(r.get(name, 0) for r in records) for name in FAULTS}
    print(f"\nexit {code}, {len(records)} steps in {wall:.0f} s; faults: {faults}")
    print(f"{'process':60} {'RSS start':>10} {'RSS end':>9} {'drift MB':>9} {'fds':>9} {'drift':>6}")
    grown = []
    for pid, (name, rss, fds) in sorted(first.items(), key=lambda item: item[1][0]):
        if pid not in last:
            print(f"{name:60} {rss:10.0f} {'gone':>9}")
            continue
        _, rss_end, fds_end = last[pid]
        print(f"{name:60} {rss:10.0f} {rss_end:9.0f} {rss_end - rss:+9.1f} {fds:4d}->{fds_end:<4d} {fds_end - fds:+6d}")
        if rss_end - rss > args.bound_mb or fds_end - fds > args.bound_fds:
            grown.append(name)
    print(f"new processes at the end: {sorted(last[pid][0] for pid in set(last) - set(first))}")
    print(f"left after exit: {[name_of(p) for p in left]}; the run's processes listened on {len(ports_used)} "
          f"ports, and after exit on {ports}")
    print(f"bounds: RSS +{args.bound_mb:g} MB, fds +{args.bound_fds} per process; over: {grown}")
    return 1 if code != 0 or grown or left or ports else 0


if __name__ == "__main__":
    sys.exit(main())
