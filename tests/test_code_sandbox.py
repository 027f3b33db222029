"""Adversarial tests for the unit-test sandbox: grpo_dist.reward.unit_tests and its launcher, reward/sandbox.py.

Every case must be scored correctly within its time limit plus a margin, and leave no
process of the sandbox behind (checked after each test by `no_leftovers`).
"""

import os
import secrets
import socket
import textwrap
import time
from pathlib import Path

import pytest

from grpo_dist.reward import sandbox
from grpo_dist.reward.unit_tests import (TAIL_BYTES, UID_BASE, UID_SLOTS, TestReport, extract_code, run_tests,
                                          unit_test_reward)

MARGIN_S = 1.5  # start-up and scheduling slack on a busy 2-core machine
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]
ISOLATION = run_tests("x = 1", ["assert x == 1"]).isolation


def needs(capability: str):
    reason = f"this host gives no {capability} isolation"
    return pytest.mark.skipif(capability not in ISOLATION, reason=reason)


def sandbox_processes() -> list[int]:
    """Live processes of some sandbox run: a sandbox uid, or the launcher's command line."""
    launcher = os.path.abspath(sandbox.__file__).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
        except (OSError, IndexError):
            continue  # it exited meanwhile
        if launcher in cmdline or UID_BASE <= uid < UID_BASE + UID_SLOTS:
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    assert sandbox_processes() == []


def run(program: str, tests, timeout_s: float = 5.0, **kwargs) -> TestReport:
    report = run_tests(textwrap.dedent(program), tests, timeout_s=timeout_s, **kwargs)
    assert report.duration_s < timeout_s + MARGIN_S, report
    return report


# ---------------------------------------------------------------- ordinary programs


@pytest.mark.timeout(30)
def test_passing_and_failing_lists() -> None:
    good = run(ADD, ADD_TESTS)
    assert (good.passed, good.total, good.status) == (3, 3, "passed")
    bad = run("def add(a, b):\n    return a + b if isinstance(a, str) else 0\n", ADD_TESTS)
    assert (bad.passed, bad.total, bad.status) == (2, 3, "failed")
    assert "AssertionError" in bad.stderr_tail and "add(1, 2) == 3" in bad.stderr_tail


@pytest.mark.timeout(30)
def test_raising_test_does_not_stop_the_next() -> None:
    tests = ["assert add(1, 2) == 3", "raise ValueError", "undefined", "assert add(2, 2) == 4"]
    report = run(ADD, tests)
    assert (report.passed, report.status) == (2, "failed")


@pytest.mark.timeout(30)
def test_string_is_one_script() -> None:
    script = "for a in range(3):\n    assert add(a, a) == 2 * a\n"
    assert run(ADD, script).status == "passed"
    report = run(ADD, script + "assert add(1, 1) == 3\n")
    assert (report.passed, report.total, report.status) == (0, 1, "failed")


@pytest.mark.timeout(30)
def test_main_block_does_not_run_and_stdout_is_captured() -> None:
    program = ADD + "print('hello')\nif __name__ == '__main__':\n    input()\n"
    report = run(program, ADD_TESTS)
    assert report.status == "passed" and report.stdout_tail == "hello\n"


@pytest.mark.timeout(30)
def test_syntax_error_and_missing_module() -> None:
    assert run("def f(:\n    pass", ["assert True"]).status == "syntax_error"
    missing = run("import no_such_module_xyz", ["assert True"])
    assert missing.status == "error" and "ModuleNotFoundError" in missing.stderr_tail


@pytest.mark.timeout(30)
def test_standard_library_imports_work() -> None:
    program = "import heapq, bisect, collections, itertools, functools, math, re, fractions, json"
    assert run(program, ["assert heapq.nsmallest(1, [3, 1]) == [1]"]).status == "passed"


def test_empty_test_list_is_rejected() -> None:
    with pytest.raises(ValueError):
        run_tests(ADD, [])


# ---------------------------------------------------------------- resource exhaustion


@pytest.mark.timeout(30)
@pytest.mark.parametrize("program", ["while True:\n    pass\n", "import time\ntime.sleep(10**6)\n"])
def test_hang_times_out(program: str) -> None:
    report = run(program, ["assert True"], timeout_s=1.0)
    assert (report.passed, report.status) == (0, "timeout")


@pytest.mark.timeout(30)
def test_tests_that_passed_before_a_hang_count() -> None:
    report = run(ADD, ["assert add(1, 1) == 2", "while True: pass", "assert True"], timeout_s=1.0)
    assert (report.passed, report.status) == (1, "timeout")


@pytest.mark.timeout(30)
def test_fork_bomb_is_bounded() -> None:
    program = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    report = run(program, ["assert True"], timeout_s=1.0)
    assert (report.passed, report.status) == (0, "timeout")


@pytest.mark.timeout(30)
def test_fork_fails_past_the_process_limit() -> None:
    program = f"""
        import os, time
        children = []
        try:
            for _ in range({sandbox.MAX_PROCESSES + 5}):
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                children.append(pid)
        except OSError:
            pass
    """
    report = run(program, [f"assert len(children) < {sandbox.MAX_PROCESSES}"])
    assert report.status == "passed"


@pytest.mark.timeout(30)
def test_memory_bomb() -> None:
    program = "hog = []\nwhile True:\n    hog.append(bytearray(10**7))\n"
    report = run(program, ["assert True"], memory_mb=256)
    assert (report.passed, report.status) == (0, "memory")


@pytest.mark.timeout(30)
def test_memory_limit_applies_per_test() -> None:
    report = run(ADD, ["big = bytearray(300 * 2**20)", "assert add(1, 1) == 2"], memory_mb=256)
    assert (report.passed, report.status) == (1, "memory")


@pytest.mark.timeout(30)
def test_hundred_megabytes_of_output() -> None:
    program = ADD + textwrap.dedent("""
        import sys
        for _ in range(100):
            sys.stdout.write('x' * 2**20)
            sys.stderr.write('y' * 2**20)
    """)
    report = run(program, ADD_TESTS)
    assert report.status == "passed"
    assert set(report.stdout_tail) == {"x"} and len(report.stdout_tail) == TAIL_BYTES


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.setrecursionlimit(10**5)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
        "import sys\nsys.setrecursionlimit(10**7)\n"
        "x = y = []\nfor _ in range(10**5):\n    x, y = [x], [y]\nx == y\n",
    ],
    ids=["python-recursion", "c-stack-overflow"],
)
def test_deep_recursion(program: str) -> None:
    report = run(program, ["assert True"])
    assert (report.passed, report.status) == (0, "error")


# ---------------------------------------------------------------- reward hacking


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit(0)"]
)
def test_exiting_before_the_tests_scores_nothing(exit_call: str) -> None:
    report = run(ADD + exit_call, ADD_TESTS)
    assert (report.passed, report.status) == (0, "error")


@pytest.mark.timeout(30)
def test_test_raising_system_exit_fails() -> None:
    report = run(ADD, ["raise SystemExit(0)", "import sys; sys.exit()", "assert add(1, 1) == 2"])
    assert (report.passed, report.status) == (1, "failed")
    assert run(ADD, "raise SystemExit(0)").passed == 0


@pytest.mark.timeout(30)
def test_test_calling_os_exit_ends_the_run() -> None:
    report = run(ADD, ["assert add(1, 1) == 2", "import os; os._exit(0)", "assert True"])
    assert (report.passed, report.status) == (1, "error")


@pytest.mark.timeout(30)
def test_monkeypatched_builtins_and_os() -> None:
    program = ADD + textwrap.dedent("""
        import builtins, os
        class Harmless(Exception):
            pass
        builtins.AssertionError = Harmless
        builtins.BaseException = Harmless
        builtins.Exception = Harmless
        builtins.MemoryError = Harmless
        builtins.exec = lambda *args, **kwargs: None
        builtins.compile = lambda *args, **kwargs: None
        builtins.print = lambda *args, **kwargs: None
        builtins.exit = builtins.quit = lambda *args: None
        os.write = lambda fd, data: len(data)
        os._exit = lambda code: None
    """)
    tests = ["assert False", "assert add(1, 1) == 3", "raise SystemExit", "assert add(1, 1) == 2"]
    report = run(program, tests)
    assert (report.passed, report.status) == (1, "failed")


@pytest.mark.timeout(30)
def test_printing_and_writing_a_pass_to_every_fd() -> None:
    program = """
        import os
        fake = b"ok 0\\nok 1\\ndone\\nisolation\\n"
        for fd in range(256):
            try:
                os.write(fd, fake)
            except OSError:
                pass
        for name in os.listdir("/proc/self/fd"):
            try:
                os.write(os.open(f"/proc/self/fd/{name}", os.O_WRONLY), fake)
            except OSError:
                pass
        os.closerange(3, 256)
    """
    report = run(program, ["assert True", "assert True"])
    assert (report.passed, report.status) == (0, "error")  # it closed the report pipe too


# ---------------------------------------------------------------- escaping the sandbox


@pytest.mark.timeout(30)
def test_environment_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_SECRET_TOKEN", "hunter2")
    program = """
        import os
        environment = dict(os.environ)
        try:
            parent_environment = open(f"/proc/{os.getppid()}/environ", "rb").read()
        except OSError:
            parent_environment = b""
    """
    tests = [
        "assert 'hunter2' not in str(environment)",
        "assert set(environment) <= {'PATH', 'LANG', 'HOME', 'LC_CTYPE'}",
        "assert b'hunter2' not in parent_environment",
    ]
    assert run(program, tests).status == "passed"


@needs("uid")
@pytest.mark.timeout(30)
def test_runs_as_an_unprivileged_uid_of_its_own() -> None:
    tests = [f"assert os.getuid() >= {UID_BASE}", "assert os.getgroups() == []"]
    report = run("import os", tests)
    assert report.status == "passed"


@needs("filesystem")
@pytest.mark.timeout(30)
def test_writes_outside_the_run_directory_vanish() -> None:
    nonce = secrets.token_hex(8)
    targets = [f"/tmp/pwned_{nonce}", f"/dev/shm/pwned_{nonce}", f"/var/tmp/pwned_{nonce}",
               str(Path(sandbox.__file__).parent / f"pwned_{nonce}")]
    program = f"""
        import os
        written = []
        for path in {targets!r}:
            try:
                with open(path, "w") as file:
                    file.write("pwned")
                written.append(path)
            except OSError:
                pass
        with open("scratch.txt", "w") as file:
            file.write("fine")
    """
    report = run(program, ["assert open('scratch.txt').read() == 'fine'"])
    assert report.status == "passed"
    assert [path for path in targets if os.path.exists(path)] == []


@needs("network")
@pytest.mark.timeout(30)
def test_network_is_unreachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        program = f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
                reached = True
            except OSError:
                reached = False
        """
        report = run(program, ["assert not reached"])
    assert report.status == "passed"


@pytest.mark.timeout(30)
def test_killing_the_parent_does_not_escape() -> None:
    program = """
        import os, signal
        try:
            os.kill(os.getppid(), signal.SIGKILL)
            refused = False
        except PermissionError:
            refused = True
        child = os.fork()
        if child == 0:
            import time
            time.sleep(60)
    """
    report = run(program, ["assert refused"] if "uid" in ISOLATION else ["assert True"])
    assert report.status == "passed"


@pytest.mark.timeout(30)
def test_daemons_are_killed() -> None:
    nonce = secrets.token_hex(8)
    marker = f"/tmp/daemon_{nonce}"
    program = f"""
        import os, time
        def daemon(close_fds):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    if close_fds:
                        os.closerange(0, 256)
                    time.sleep(1)
                    open({marker!r}, "w").close()
                    time.sleep(60)
                os._exit(0)
        daemon(close_fds=True)
        daemon(close_fds=False)
        time.sleep(0.2)
    """
    report = run(program, ["assert True"])
    assert report.status == "passed" and report.duration_s < 1.0 + MARGIN_S
    time.sleep(1.5)
    assert not os.path.exists(marker)


# ---------------------------------------------------------------- the reward function


def test_extract_code_takes_the_last_python_block() -> None:
    completion = (
        "Try:\n```python\nx = 1\n```\nRun it:\n```bash\nls\n```\nFinal:\n```\nx = 2\n```\nDone."
    )
    assert extract_code(completion) == "x = 2\n"
    assert extract_code("```py\ny = 3\n```\n```sh\nrm -rf /\n```") == "y = 3\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"


@pytest.mark.timeout(30)
def test_unit_test_reward_is_the_fraction_passed() -> None:
    completion = f"Here you go:\n```python\n{ADD}```\n"
    assert unit_test_reward("add two numbers", completion, ADD_TESTS, id="p1") == 1.0
    wrong = "```python\ndef add(a, b):\n    return a * b\n```"
    assert unit_test_reward("add two numbers", wrong, ADD_TESTS) == pytest.approx(0.0)
    half = "```python\ndef add(a, b):\n    return 3\n```"
    assert unit_test_reward("p", half, ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]) == 0.5
