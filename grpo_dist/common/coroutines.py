"""An event loop on a daemon thread of its own, for user code that may block it (a sync call in an
async environment or reward): callers await its coroutines from their own loop, so that their
deadlines (`asyncio.wait_for`) fire whatever the coroutine does; one that blocks delays only the
other coroutines of this loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


class CoroutineLoop:
    """Runs coroutines on its thread's loop until `stop`; a coroutine past its caller's deadline is
    cancelled there (when it blocks: once it returns)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=serve_then_close, args=(self.loop,), daemon=True, name=name).start()

    async def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """`coroutine`'s result, awaited on the caller's loop; cancelling the caller cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stop(self) -> None:
        """Stop the loop (not joined: it may be blocked; it closes itself when it gets to stop)."""
        self.loop.call_soon_threadsafe(self.loop.stop)


def serve_then_close(loop: asyncio.AbstractEventLoop) -> None:
    """Run `loop` until stopped, then cancel what is left on it (the calls abandoned at their
    deadlines), give them a second to end, and close it."""
    loop.run_forever()
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=1.0))
    loop.close()
