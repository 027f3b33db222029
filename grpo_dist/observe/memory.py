"""Memory in MiB, measured one way for every metric and benchmark that reports it.

    resident_mb()        this process's resident set now (Linux: /proc/self/statm)
    resident_peak_mb()   its highest resident set since it started (ru_maxrss; no reset)
    reset_peak(device)   start a new peak on a CUDA device (nothing to do on the CPU)
    peak_mb(device)      CUDA: torch's most allocated since `reset_peak`; "cpu": `resident_peak_mb()`
    process_device()     "cuda" where this process has started CUDA, else "cpu"
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import torch


def resident_mb() -> float:
    """This process's resident set now (Linux only: the second field of /proc/self/statm, in pages)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def resident_peak_mb() -> float:
    """This process's peak resident set since it started (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def process_device() -> str:
    """Where this process's memory lives: "cuda" once it has started CUDA, else "cpu"."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def reset_peak(device: str) -> None:
    """Make `peak_mb(device)` count from now on a CUDA device; the CPU's peak cannot be reset."""
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: str) -> float:
    """On a CUDA device, the most memory torch allocated since `reset_peak`; on "cpu", the
    process's peak resident set since it started."""
    if device != "cpu":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resident_peak_mb()
