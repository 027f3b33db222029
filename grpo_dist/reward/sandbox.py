"""The sandbox: the launcher and the harness that run an untrusted program against its tests.

Standard library only, and never imported by the process it isolates: `unit_tests.run_tests`
starts this file as `python -I -S -B sandbox.py REPORT_FD` with an empty environment, feeds
the job (program, tests, nonce, uid, run directory, limits) as JSON on stdin, and reads the
report pipe. The launcher isolates what the host allows, then forks the sandbox process,
which drops privileges, sets resource limits and runs the program and the tests in one
interpreter.

What is isolated (see docs/sandbox.md for what was measured):
- always: resource limits (RLIMIT_CPU, AS, FSIZE, NOFILE, NPROC, CORE=0), a wall-clock
  limit enforced by the launcher, no inherited environment variables, no stdin, and
  cleanup of every process the run started: the launcher is a child subreaper, so
  double-forked, setsid'ed daemons stay its descendants, and it reaps them all;
- as root: the sandbox runs as the uid the caller holds for the run, so RLIMIT_NPROC binds
  per run, runs cannot signal each other or the launcher, and cleanup is exact and
  atomic: kill(-1, SIGKILL) from a process of that uid reaches every process of the run
  at once, fork bombs included. Without root, cleanup kills the sandbox's process group,
  then the launcher's children round by round (a fork bomb that leaves the process group
  can outpace that);
- as root with CAP_SYS_ADMIN: new network namespace (no interface is up, not even
  loopback) and mount namespace in which every mount is read-only except fresh small
  tmpfs mounts on the run's directory, /tmp and /dev/shm, and /proc hides other users'
  processes (hidepid). Whatever the program writes disappears with the namespace.
Not isolated: reading world-readable files; without root, the sandbox runs as the
caller's user and can signal (or kill) the caller's processes, and network and file
system are shared; without CAP_SYS_ADMIN the network and file system are shared.

The tests learn nothing from the program's output. The sandbox reports each passed test
as "<nonce> ok <i>" on a pipe only the run holds; the nonce is random per run and the
writer function, `os.write` and the fd are bound before the program starts, so a
program that prints, exits early, raises SystemExit, closes fds or rebinds builtins can
only lose reports, never add them. A program that deliberately reads the harness's
memory (frames, gc) could find the nonce: this guards against learned reward hacks, not
against an adversary writing an exploit against this harness; nor does it stop an
object whose __eq__ always returns True from satisfying `assert f(x) == y`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import linecache
import math
import os
import resource
import select
import signal
import stat
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

TIMEOUT_EXIT = 124  # the launcher's exit code when the run hit its time limit
MAX_PROCESSES = 16  # RLIMIT_NPROC of the sandbox
_TRACEBACK_FRAMES = 20
_MAX_FILES = 64
_MAX_FILE_BYTES = 16 << 20
_SCRATCH_SIZE = "64m"
_SHARED_TMP_SIZE = "16m"

# Linux constants (x86_64 and the generic syscall table agree on mount_setattr).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_PRIVATE = 32, 4096, 1 << 18
_MS_NOSUID_NODEV = _MS_NOSUID | _MS_NODEV
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


# ---------------------------------------------------------------- the launcher (root)


def _launcher_main(report_fd: int) -> int:
    """Isolate, fork the sandbox, wait for it until the deadline, then kill what is left."""
    job = json.loads(sys.stdin.buffer.read())
    deadline = time.monotonic() + job["timeout_s"]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.umask(0o022)
    uid = job["uid"]
    isolation = _isolate(job["workdir"], uid)
    os.write(report_fd, f"{job['nonce']} isolation {' '.join(isolation)}\n".encode())
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if uid is not None:
        _kill_every_process_of(uid)  # left over by an earlier run whose launcher was killed
    exit_now = os._exit
    child = os.fork()
    if child == 0:
        try:
            _run_sandbox(job, report_fd)
        finally:
            exit_now(1)
    status = _wait_until(child, deadline)
    _kill_sandbox(uid, child)
    timed_out = status is None or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU)
    return TIMEOUT_EXIT if timed_out else 0


def _isolate(workdir: str, uid: int | None) -> list[str]:
    """Apply the isolation this host allows; returns what was achieved."""
    if uid is None:
        return []
    isolation = ["uid"]
    if _libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET) == 0:
        isolation.append("network")
        if _make_all_mounts_private_and_readonly():
            _mount_scratch(workdir, uid)
            _expose_sys_path()
            _mount("proc", "/proc", "proc", _MS_NOSUID_NODEV | _MS_NOEXEC, "hidepid=invisible")
            isolation.append("filesystem")
    if "filesystem" not in isolation:
        os.chown(workdir, uid, uid)
    return isolation


def _make_all_mounts_private_and_readonly() -> bool:
    """mount_setattr(2) on / with AT_RECURSIVE: one atomic call (Linux >= 5.12)."""

    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clr", "propagation", "userns")]

    attr = MountAttr(_MOUNT_ATTR_RDONLY, 0, _MS_PRIVATE, 0)
    arguments = (b"/", _AT_RECURSIVE, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    return _libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, *arguments) == 0


def _mount_scratch(workdir: str, uid: int) -> None:
    """Small writable tmpfs mounts on the run's directory, /tmp and /dev/shm."""
    for shared in ("/tmp", "/dev/shm"):
        if os.path.isdir(shared):
            _mount("tmpfs", shared, "tmpfs", _MS_NOSUID_NODEV, f"size={_SHARED_TMP_SIZE},mode=1777")
    os.makedirs(workdir, exist_ok=True)
    options = f"size={_SCRATCH_SIZE},mode=0700,uid={uid},gid={uid}"
    _mount("tmpfs", workdir, "tmpfs", _MS_NOSUID_NODEV, options)


def _expose_sys_path() -> None:
    """Make sys.path's entries readable for the sandbox user, at the same paths.

    The interpreter may live under a directory others cannot enter (e.g. /root/.pyenv).
    Such a directory is covered with a tmpfs holding just the path down to each entry,
    bind-mounted read-only there; the sandbox could not enter that directory anyway.
    """
    hidden = {entry: _untraversable_ancestor(entry) for entry in sys.path if os.path.exists(entry)}
    sources = {entry: os.open(entry, os.O_PATH) for entry, blocked in hidden.items() if blocked}
    for blocked in set(hidden.values()) - {None}:
        _mount("tmpfs", blocked, "tmpfs", _MS_NOSUID_NODEV, "size=1m,mode=0755")
    for entry, fd in sources.items():
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.makedirs(entry, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            open(entry, "a").close()
        _mount(f"/proc/self/fd/{fd}", entry, None, _MS_BIND)
        _mount(None, entry, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID_NODEV)
        os.close(fd)


def _untraversable_ancestor(path: str) -> str | None:
    """The topmost directory above `path` that users other than its owner cannot enter."""
    parts = os.path.abspath(path).split(os.sep)[1:-1]
    for depth in range(1, len(parts) + 1):
        directory = os.sep + os.path.join(*parts[:depth])
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return directory
    return None


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None
) -> None:
    arguments = (_c_string(source), target.encode(), _c_string(fstype), flags, _c_string(options))
    if _libc.mount(*arguments) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {fstype or source} on {target}: {os.strerror(errno)}")


def _c_string(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _wait_until(pid: int, deadline: float) -> int | None:
    """The child's wait status, or None if it is still running at `deadline`."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(pidfd)
    return os.waitpid(pid, 0)[1] if ready else None


def _kill_sandbox(uid: int | None, child: int) -> None:
    """Kill every process the run started, then reap them all (we are their subreaper)."""
    if uid is not None:
        _kill_every_process_of(uid)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)  # one atomic blow for a fork bomb
        _kill_descendants()  # and whatever left the process group
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _kill_every_process_of(uid: int) -> None:
    """kill(-1, SIGKILL) as `uid`: one atomic blow to every process of that uid but the caller."""
    killer = os.fork()
    if killer == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.geteuid() == uid:  # never kill(-1) as root
                os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(killer, 0)


def _kill_descendants() -> None:
    """SIGKILL our children, round after round, until none is left.

    As a child subreaper we inherit every orphan below us, so each round reaches the
    next generation, whatever sessions or process groups they moved to.
    """
    children = f"/proc/self/task/{os.getpid()}/children"
    while True:
        with open(children) as file:
            pids = [int(pid) for pid in file.read().split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


# ---------------------------------------------------------------- the sandbox process


def _run_sandbox(job: dict, report_fd: int) -> NoReturn:
    """Drop privileges, set limits, run the harness, exit without cleanup handlers."""
    exit_now, flush_stdout = os._exit, sys.stdout.flush
    try:
        os.setpgid(0, 0)
        if job["uid"] is not None:
            os.setgroups([])
            os.setgid(job["uid"])
            os.setuid(job["uid"])
            _prctl(_PR_SET_DUMPABLE, 1)  # let the sandbox read its own /proc/self again
        _set_limits(job["timeout_s"], job["memory_mb"])
        os.chdir(job["workdir"])
    except BaseException:
        traceback.print_exc()
        exit_now(1)
    _harness(job["program"], job["tests"], _reporter(report_fd, job["nonce"]))
    try:
        flush_stdout()
    finally:
        exit_now(0)


def _set_limits(timeout_s: float, memory_mb: int) -> None:
    cpu_s = math.ceil(timeout_s) + 1
    limits = {
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
        resource.RLIMIT_AS: (memory_mb << 20,) * 2,
        resource.RLIMIT_FSIZE: (_MAX_FILE_BYTES,) * 2,
        resource.RLIMIT_NOFILE: (_MAX_FILES,) * 2,
        resource.RLIMIT_NPROC: (MAX_PROCESSES,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for limit, values in limits.items():
        resource.setrlimit(limit, values)


def _reporter(fd: int, nonce: str) -> Callable[[bytes], None]:
    """A function that writes "<nonce> <message>" to `fd`, immune to later monkeypatching."""
    prefix, write, write_error = nonce.encode() + b" ", os.write, OSError

    def report(message: bytes) -> None:
        try:
            write(fd, prefix + message + b"\n")
        except write_error:
            pass

    return report


def _harness(program: str, tests: list[str], report: Callable[[bytes], None]) -> None:
    """Run the program, then each test in its namespace, reporting through `report`.

    The program may rebind builtins, `os` or this module's globals, so everything used
    after it starts is a local bound beforehand. Tracebacks go to stderr, best effort.
    """
    run, memory_error, any_error, print_exc = exec, MemoryError, BaseException, traceback.print_exc

    def show_traceback() -> None:
        try:
            print_exc(limit=_TRACEBACK_FRAMES)  # a positive limit stays cheap for deep recursion
        except any_error:
            pass

    try:
        program_code = _compile(program, "solution.py")
    except (SyntaxError, ValueError):
        traceback.print_exc()
        report(b"program syntax_error")
        return
    jobs = []
    for index, source in enumerate(tests):
        try:
            jobs.append((_compile(source, f"test_{index}.py"), b"%d" % index))
        except (SyntaxError, ValueError):
            traceback.print_exc()
    namespace = {"__name__": "solution"}
    try:
        run(program_code, namespace)
    except memory_error:
        report(b"program memory")
        return
    except any_error:
        show_traceback()
        report(b"program error")
        return
    for code, index in jobs:
        try:
            run(code, namespace)
        except memory_error:
            report(b"memory " + index)
        except any_error:
            show_traceback()
        else:
            report(b"ok " + index)
    report(b"done")


def _compile(source: str, filename: str):
    """Compile without this module's __future__ flags; keep the source for tracebacks."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec", dont_inherit=True)


if __name__ == "__main__":
    sys.exit(_launcher_main(int(sys.argv[1])))
