"""The unit-test reward: run a completion's code against the row's tests in the sandbox.

`run_tests` holds a sandbox uid for the run (root only: 60000 + slot, a lock file keeps
other runs, in any process, off it), makes a run directory, and starts the launcher of
`grpo_dist/reward/sandbox.py` as `python -I -S -B sandbox.py FD` with an empty
environment (a minimal PATH, LANG, HOME=the run's directory), stdin fed with the job and
then closed, stdout/stderr drained into capped tails, and a new session. What the sandbox
isolates, and why a program cannot fake a pass, is said there. The score comes only from
the "<nonce> ..." lines of the report pipe, never from the program's output.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from grpo_dist.reward import sandbox

UID_BASE = 60000  # the sandbox uids are UID_BASE + slot, slot < UID_SLOTS
UID_SLOTS = 1000
TAIL_BYTES = 2048  # of stdout and of stderr kept in a TestReport
_LOCK_DIR = "/run/grpo_dist_sandbox"
_PATH = "/usr/local/bin:/usr/bin:/bin"
_REPORT_CAP_BYTES = 1 << 20
_BACKSTOP_GRACE_S = 2.0
_PYTHON_TAGS = ("", "python", "py", "python3")
_FENCED_BLOCK = re.compile(r"^[ \t]*```([^\n`]*)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class TestReport:
    """How a program did against its tests.

    status: "passed" (every test passed), "failed" (ran to the end, some test failed),
    "timeout" (wall-clock or CPU limit), "memory" (MemoryError under memory_mb),
    "syntax_error" (the program does not compile) or "error" (the program raised while
    loading, exited or died before the tests finished, or the sandbox failed to start).
    isolation: what the host allowed, a subset of ("uid", "network", "filesystem").
    """

    __test__ = False  # not a pytest test class

    passed: int
    total: int
    status: str
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    isolation: tuple[str, ...]


def run_tests(
    program: str, tests: str | list[str], *, timeout_s: float = 5.0, memory_mb: int = 512
) -> TestReport:
    """Run `program`, then the tests in its namespace, in a fresh sandbox.

    A string is one test script: it passes if it runs to its end. A list holds one test
    per item (an assert or any snippet); each passes if it runs without raising, and a
    failing test does not stop the next. `timeout_s` is wall-clock for the whole run:
    tests that passed before it ran out still count. `memory_mb` caps the address space
    of each process the program starts.
    """
    test_list = [tests] if isinstance(tests, str) else list(tests)
    if not test_list:
        raise ValueError("run_tests needs at least one test")
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    with _sandbox_uid() as uid, tempfile.TemporaryDirectory(prefix="grpo_sandbox_") as workdir:
        job = {
            "program": program, "tests": test_list, "nonce": nonce, "uid": uid,
            "workdir": workdir, "timeout_s": timeout_s, "memory_mb": memory_mb,
        }
        returncode, outputs = _launch(job, deadline=start + timeout_s + _BACKSTOP_GRACE_S)
    passed, events, isolation = _parse_report(outputs["report"], nonce, len(test_list))
    return TestReport(
        passed=passed,
        total=len(test_list),
        status=_status(passed, len(test_list), events, returncode),
        duration_s=time.monotonic() - start,
        stdout_tail=outputs["stdout"].decode(errors="replace"),
        stderr_tail=outputs["stderr"].decode(errors="replace"),
        isolation=isolation,
    )


def extract_code(completion: str) -> str:
    """The last ```python (or untagged) fenced block of `completion`, else all of it."""
    blocks = _FENCED_BLOCK.findall(completion)
    python_blocks = [body for tag, body in blocks if tag.strip().lower() in _PYTHON_TAGS]
    return python_blocks[-1] if python_blocks else completion


def unit_test_reward(
    prompt: str,
    completion: str,
    tests: str | list[str],
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    **fields: object,
) -> float:
    """Fraction of `tests` that the completion's code passes; other row fields are ignored.

    `timeout_s` and `memory_mb` go to `run_tests`; keep the reward's pool deadline
    (reward.timeout_s) above timeout_s + 2 s so that the sandbox's own limit comes first.
    """
    report = run_tests(extract_code(completion), tests, timeout_s=timeout_s, memory_mb=memory_mb)
    return report.passed / report.total


def _check_limits(timeout_s: float = 5.0, memory_mb: int = 512, **_: object) -> None:
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"unit_tests needs timeout_s > 0 and memory_mb > 0, got {timeout_s}, {memory_mb}")


unit_test_reward.check_options = _check_limits  # type: ignore[attr-defined]


# ---------------------------------------------------------------- starting the launcher, reading its report


@contextlib.contextmanager
def _sandbox_uid() -> Iterator[int | None]:
    """A uid no other run (in any process) holds meanwhile; None unless we are root."""
    if os.geteuid() != 0:
        yield None
        return
    os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
    for uid in range(UID_BASE, UID_BASE + UID_SLOTS):
        if _uid_has_account(uid):
            continue
        fd = os.open(f"{_LOCK_DIR}/{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {UID_SLOTS} sandbox uids are in use")


def _uid_has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _launch(job: dict, deadline: float) -> tuple[int, dict[str, bytes]]:
    """Run the launcher on `job`; its exit code and the kept stdout, stderr and report.

    The launcher enforces the job's time limit itself; if it is still running at
    `deadline`, its process group is killed and the run counts as a timeout.
    """
    outputs = {"stdout": b"", "stderr": b"", "report": b""}
    report_read, report_write = os.pipe()
    with open(report_read, "rb", buffering=0) as report:
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", os.path.abspath(sandbox.__file__), str(report_write)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(report_write,), cwd=job["workdir"], start_new_session=True,
                env={"PATH": _PATH, "LANG": "C.UTF-8", "HOME": job["workdir"]},
            )
        finally:
            os.close(report_write)
        with launcher:
            try:
                finished = _pump(launcher, json.dumps(job).encode(), report, deadline, outputs)
                if finished:
                    launcher.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            finally:
                overran = launcher.poll() is None
                if overran:
                    os.killpg(launcher.pid, signal.SIGKILL)
                    launcher.wait()
    return (sandbox.TIMEOUT_EXIT if overran else launcher.returncode), outputs


def _pump(
    launcher: subprocess.Popen, job: bytes, report, deadline: float, kept: dict[str, bytes]
) -> bool:
    """Write `job` to the launcher's stdin and drain its outputs into `kept` until they close.

    stdout and stderr keep their last TAIL_BYTES, the report its first _REPORT_CAP_BYTES;
    the rest is read and dropped, so no amount of output blocks the sandbox or fills
    memory. Returns False if `deadline` came first.
    """
    os.set_blocking(launcher.stdin.fileno(), False)
    with selectors.DefaultSelector() as selector:
        selector.register(launcher.stdin, selectors.EVENT_WRITE)
        selector.register(launcher.stdout, selectors.EVENT_READ, "stdout")
        selector.register(launcher.stderr, selectors.EVENT_READ, "stderr")
        selector.register(report, selectors.EVENT_READ, "report")
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in selector.select(remaining):
                if key.fileobj is launcher.stdin:
                    job = _feed(launcher.stdin, job, selector)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.data == "report":
                    kept["report"] = (kept["report"] + chunk)[:_REPORT_CAP_BYTES]
                else:
                    kept[key.data] = (kept[key.data] + chunk)[-TAIL_BYTES:]
    return True


def _feed(stdin, data: bytes, selector: selectors.BaseSelector) -> bytes:
    """Write what the pipe takes of `data`; close stdin when all is written. Returns the rest."""
    try:
        data = data[os.write(stdin.fileno(), data):]
    except BlockingIOError:
        return data
    except BrokenPipeError:
        data = b""
    if not data:
        selector.unregister(stdin)
        stdin.close()
    return data


def _parse_report(report: bytes, nonce: str, total: int) -> tuple[int, set[str], tuple[str, ...]]:
    """Passed-test count, events ("done", "memory", "syntax_error", "error") and isolation."""
    prefix = nonce.encode() + b" "
    passed: set[int] = set()
    events: set[str] = set()
    isolation: tuple[str, ...] = ()
    for line in report.split(b"\n"):
        if not line.startswith(prefix):
            continue
        match line[len(prefix):].decode(errors="replace").split():
            case ["ok", index] if index.isdigit() and int(index) < total:
                passed.add(int(index))
            case ["memory", _]:
                events.add("memory")
            case ["program", kind]:
                events.add(kind)
            case ["done"]:
                events.add("done")
            case ["isolation", *names]:
                isolation = tuple(names)
    return len(passed), events, isolation


def _status(passed: int, total: int, events: set[str], returncode: int) -> str:
    if "done" in events and passed == total:
        return "passed"
    if returncode == sandbox.TIMEOUT_EXIT:
        return "timeout"
    for event in ("syntax_error", "memory"):
        if event in events:
            return event
    return "failed" if "done" in events else "error"
