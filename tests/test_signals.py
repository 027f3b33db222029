"""signals.stop_on_signals in this process: the first SIGINT/SIGTERM asks, the second interrupts."""

import os
import signal

import pytest

from grpo_dist.controller.signals import stop_on_signals


def test_the_first_signal_asks_to_stop_the_second_stops_now_and_the_handlers_come_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    asked: list[int] = []
    with stop_on_signals(asked.append):
        os.kill(os.getpid(), signal.SIGTERM)
        assert asked == [signal.SIGTERM]  # nothing more: the run goes on to the end of its step
        with pytest.raises(KeyboardInterrupt, match="SIGINT again: stopping now, without a checkpoint"):
            os.kill(os.getpid(), signal.SIGINT)
    assert asked == [signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before
