"""grpo_dist/observe/memory.py against the kernel's own accounting of this process (Linux)."""

import sys

import pytest

from grpo_dist.observe.memory import peak_mb, process_device, resident_mb, resident_peak_mb

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self")


def kernel_mb(field: str) -> float:
    """VmRSS (resident now) or VmHWM (its high-water mark) from /proc/self/status, kB -> MiB."""
    for line in open("/proc/self/status"):
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def test_the_resident_set_now_and_its_peak_match_the_kernels_and_grow_with_an_allocation():
    before = resident_mb()
    assert abs(before - kernel_mb("VmRSS")) < 2  # MiB; read a moment apart
    above_peak = int(resident_peak_mb() - before) + 64  # MiB: enough to set a new high-water mark
    block = b"\x01" * (above_peak << 20)  # written, so every page is resident
    grown = resident_mb() - before
    assert above_peak - 2 < grown < above_peak + 8, grown
    # ru_maxrss of a process past its earlier peak is the kernel's high-water mark (KiB on Linux)
    assert abs(resident_peak_mb() - kernel_mb("VmHWM")) < 1
    assert resident_peak_mb() >= resident_mb() - 1
    del block


def test_the_peak_metric_on_the_cpu_is_the_resident_peak():
    assert process_device() == "cpu"  # no CUDA started in this process
    assert 50 < peak_mb(process_device()) < 64_000  # MiB: torch is loaded here
    assert peak_mb("cpu") >= kernel_mb("VmHWM") - 1  # ru_maxrss is at least the current high-water mark
