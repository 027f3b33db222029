"""Network helpers shared by the learner, deploy scripts and tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that was free on this host a moment ago (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
