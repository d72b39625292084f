"""Which device a command runs on: the model's, chosen once; every tensor is then made there."""

from __future__ import annotations

import os

import torch
from torch import nn

from .errors import TfbuilderError


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
            raise TfbuilderError(f"--device {device}: this machine has {count} CUDA GPU(s) (cuda:0 .. cuda:{count - 1})")
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


def idle_cores() -> int:
    """Cores not already busy: usable cores minus the 1-minute load average, at least 1.

    Threads that must share a core with another busy process wait on each other at every
    parallel region; on 2 cores beside one busy process, 2 threads trained the quick start several
    times slower than 1 (docs/getting-started.md, "Threads")."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, min(usable_cores(), round(usable_cores() - load)))


def threads(setting: int | str) -> int:
    """The CPU threads for ``trainer.threads`` (``auto``: :func:`idle_cores`)."""
    return idle_cores() if setting == "auto" else int(setting)

