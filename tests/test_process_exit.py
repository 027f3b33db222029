"""end_process: how launch and eval end (the exit handlers run, the streams are flushed, the
interpreter's finalization is skipped), checked in a process of its own."""

import subprocess
import sys

SCRIPT = """
import atexit, sys
from grpo_dist.common.process_exit import end_process

class Finalized:
    def __del__(self):
        sys.stderr.write(" finalized")

kept = Finalized()  # a module global: only the interpreter's finalization deletes it
atexit.register(lambda: print(" exit handler", end=""))
print("summary", end="")  # stdout is a pipe here, so this waits in its buffer
sys.stderr.write("last words")
{end}(3)
"""


def run(end: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT.format(end=end)], capture_output=True, text=True, timeout=60)


def test_end_process_runs_the_exit_handlers_flushes_and_skips_finalization():
    ended = run("end_process")
    assert ended.returncode == 3
    assert ended.stdout == "summary exit handler"
    assert ended.stderr == "last words"


def test_the_same_script_ending_with_sys_exit_is_finalized():
    """The control: what end_process skips is there to skip."""
    ended = run("sys.exit")
    assert (ended.returncode, ended.stdout) == (3, "summary exit handler")
    assert ended.stderr == "last words finalized"


def test_eval_exits_2_with_its_error_as_the_last_line(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    ended = subprocess.run([sys.executable, "-m", "grpo_dist.eval", "--checkpoint", str(missing)],
                           capture_output=True, text=True, timeout=120)
    assert ended.returncode == 2, ended.stderr
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(missing) in last, ended.stderr
