"""The peak memory of a training run, for its summary and the sweep reports (no Lightning here).

On a GPU: the most memory torch allocated on the device since the run began. On a CPU: the process's
peak resident memory since the run began (Linux resets the high-water mark, ``VmHWM``, through
``/proc/self/clear_refs``, so runs of one sweep process are measured each on its own); where that
is unavailable, the process's peak since it started.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def reset_peak(gpu: bool) -> None:
    """Start measuring: on a GPU the allocator's peak, on a CPU the resident high-water mark."""
    if gpu:
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        _CLEAR.write_text("5")  # "5": reset the peak resident set size (Linux, proc(5))
    except OSError:
        pass  # not Linux, or not allowed: the process's own peak is reported


def peak_mb(gpu: bool) -> float | None:
    """The peak since :func:`reset_peak`, in MiB; None when nothing can say."""
    if gpu:
        return torch.cuda.max_memory_allocated() / 2**20
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
