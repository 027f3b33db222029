"""SIGINT and SIGTERM during a run: the first one asks the run to stop cleanly, the second stops it now.

The trainer installs these handlers after Ray started (ray.init installs its own SIGTERM
handler in the driver, which exits at once) and puts the previous ones back when the run
ends. The first signal calls `on_first(signum)`, nothing more: the controller finishes the
step in progress, saves a checkpoint and returns. The second raises KeyboardInterrupt
wherever the driver is, also inside a wait on Ray, and the run stops without a checkpoint.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The first SIGINT/SIGTERM received (`signum`, None until then): the step loop finishes the
    step in progress, saves a checkpoint and returns."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        print(f"{name}: finishing the step in progress, then saving a checkpoint (send {name} again to stop now)",
              file=sys.stderr, flush=True)


@contextmanager
def stop_on_signals(on_first: Callable[[int], None]) -> Iterator[None]:
    """Handle SIGINT and SIGTERM while the block runs (only the main thread can: elsewhere
    nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopping now, without a checkpoint")
        received.append(signum)
        on_first(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
