"""Ending a command line's process once its work is done (launch and eval both end here).

After main returns, the interpreter's finalization spends seconds (1.9 s on 2 cores) in a last
garbage collection over every object torch's and transformers' imports made, when everything
is written and Ray is down. `end_process` runs the exit handlers, flushes the standard streams
and ends the process without that collection. (gc.freeze() spared the collection too, but left
nanobind's modules, which vLLM's dependencies bring, to report their uncollected objects as
leaks on stderr.)
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Exit with `code` after the atexit handlers and a flush of stdout and stderr, skipping finalization."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
