"""A run's ``fit.lock`` seen from a rank other than 0, which never takes it.

Under a cluster launcher (torchrun, SLURM's srun) every rank of a job starts at once; rank 0 takes the
run's lock (:class:`tfbuilder.runs.checkpoints.RunLock`) and refuses a directory another job trains in.
A rank that went on to wait for rank 0 in the process group would then wait forever: so every other
rank looks at the lock too (:func:`held_by_another`) and refuses as rank 0 does when a process other
than its own job's rank 0 holds it. Rank 0 names its job in the lock's line (:func:`job`).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from pathlib import Path

_LINE = re.compile(r"pid (\d+) on ([^\n]*?) since [^\n]*?(?: job ([^\n]+))?\n?")
EMPTY_WAIT = 5.0  # seconds a held lock's line may stay empty (rank 0 between taking it and writing it)


def job() -> str:
    """What names this process's job for every rank of it: the SLURM job (a requeued job keeps its id),
    else the address and port the launcher gave every rank (torchrun, or a launcher setting them); ""
    when none is known (a single process, or Lightning's own launcher, whose ranks are rank 0's children)."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    slurm = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    if slurm:
        return f"slurm {slurm}"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"rendezvous {addr}:{port}" if addr and port else ""


def held_by_another(run_dir: Path) -> str | None:
    """The line of the process holding ``run_dir``'s lock when it is not this job's rank 0 (this job
    has a name that the line does not carry, and it is not this process's parent); None when the lock
    is free or held by this job. The lock is only tested (a shared lock, let go at once), never held."""
    path = Path(run_dir) / "fit.lock"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # no lock yet (or not a file: rank 0 says so)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _other(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _other(fd: int) -> str | None:
    deadline = time.monotonic() + EMPTY_WAIT
    line = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    while not line.strip() and time.monotonic() < deadline:
        time.sleep(0.05)
        line = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    held = _LINE.fullmatch(line)
    if held is None:
        return line.strip() or "another process"
    pid, host, tag = int(held.group(1)), held.group(2), held.group(3)
    ours = job()
    if (ours and tag == ours) or (host == socket.gethostname() and pid == os.getppid()):
        return None
    return line.strip()
