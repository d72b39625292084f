"""Which device a command runs on: the model's, chosen once; every tensor is then made there."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from torch import nn

from tfbuilder.errors import TfbuilderError


def default_device() -> torch.device:
    """A GPU when one is present (CUDA, then Apple's MPS), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve(device: str | torch.device | None) -> torch.device:
    """``device`` checked against this machine (``None``: :func:`default_device`); e.g. ``cpu``,
    ``cuda``, ``cuda:1``. A device that is not there is a clear error, not a traceback later."""
    if device is None:
        return default_device()
    try:
        found = torch.device(device)
    except (RuntimeError, ValueError):
        raise TfbuilderError(f"--device: '{device}' is not a device (e.g. cpu, cuda, cuda:1, mps)") from None
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise TfbuilderError(f"--device {device}: no CUDA GPU is available on this machine")
        if found.index is not None and found.index >= count:
            raise TfbuilderError(
                f"--device {device}: this machine has {count} CUDA GPU(s) (cuda:0 .. cuda:{count - 1})"
            )
    elif found.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise TfbuilderError(f"--device {device}: MPS is not available on this machine")
    elif found.type not in ("cpu", "cuda", "mps"):
        raise TfbuilderError(f"--device: '{device}' is not supported (cpu, cuda[:N], mps)")
    return found


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters live (inputs are made there)."""
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def count(devices: int | list[int] | str, *, gpu: bool) -> int:
    """How many devices a ``trainer.devices`` setting uses on one node: ``auto`` is every GPU (one
    process on a CPU), a list names GPU indices, a number is a count."""
    if isinstance(devices, list):
        return len(devices)
    if devices == "auto":
        return max(torch.cuda.device_count(), 1) if gpu else 1
    return int(devices)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a SLURM allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cores(
    seconds: float = 0.25,
    *,
    read_stat: Callable[[], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    cpus: int | None = None,
) -> float:
    """Cores other processes keep busy now: the machine's busy share over ``seconds`` (from
    /proc/stat) while this process sleeps, so its own work does not count; elsewhere the 1-minute
    load average (which does count it). ``read_stat`` (the text of /proc/stat), ``sleep`` and
    ``cpus`` (the machine's cores) stand in for the machine where a caller supplies them."""
    read_stat = read_stat or _read_proc_stat
    try:
        before = cpu_times(read_stat())
        sleep(seconds)
        after = cpu_times(read_stat())
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return 0.0
    return busy_share(before, after) * (cpus or os.cpu_count() or 1)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of time the machine was busy between two ``(all, idle)`` readings of
    :func:`cpu_times` (0 when no time passed)."""
    total = after[0] - before[0]
    idle = after[1] - before[1]
    return 0.0 if total <= 0 else 1.0 - idle / total


def cpu_times(stat: str) -> tuple[int, int]:
    """(all, idle) jiffies of the whole machine from the text of /proc/stat: its first line,
    ``cpu user nice system idle iowait irq softirq steal guest guest_nice`` (proc(5)); guest time
    is already inside user and nice, and iowait is idle time."""
    values = [int(v) for v in stat.split("\n", 1)[0].split()[1:]]
    return sum(values[:8]), values[3] + values[4]


def _read_proc_stat() -> str:
    with open("/proc/stat", encoding="ascii") as f:
        return f.readline()


def idle_cores() -> int:
    """Cores not already busy: usable cores minus the cores other processes keep busy, at least 1.

    Threads that must share a core with another busy process wait on each other at every
    parallel region; on 2 cores beside one busy process, 2 threads trained the quick start about
    three times slower than 1 (docs/getting-started.md, "CPU threads")."""
    cores = usable_cores()
    return max(1, min(cores, round(cores - busy_cores())))


def threads(setting: int | str) -> int:
    """The CPU threads for ``trainer.threads`` (``auto``: :func:`idle_cores`)."""
    return idle_cores() if setting == "auto" else int(setting)
