"""Ctrl-C and SIGTERM outside the training loop: start-up unwinds cleanly (no Lightning here).

While a fit prepares (reads checkpoints, prepares data, sets up its run directory) the first SIGINT,
SIGTERM, SIGUSR1 or SIGUSR2 raises :class:`Stop`, which unwinds what was under way (atomic writes remove their
temporary files, the run's lock is released) and becomes an exit status of 128 + the signal with a
message saying what was kept. Further signals while it unwinds are ignored. Once training starts,
the training loop's own handler (callbacks.RunGuard) takes over: it validates and checkpoints the
current step before stopping.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""Ctrl-C; a scheduler's notice (SIGTERM); SLURM's warning before a time limit (``--signal=USR1@90``),
which also asks for a requeue (:func:`requeue`); submitit's warning (its jobs' ``--signal=USR2@90``),
after which submitit's own handler requeues the job (:class:`tfbuilder.use.launch.Entry`)."""
REQUEUE_SIGNAL = signal.SIGUSR1


class Stop(BaseException):
    """A signal stopped a fit outside its training loop (a BaseException: nothing may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def raising() -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises :class:`Stop`; the handlers the process
    had are given back when it ends. Only the main thread receives signals: elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            return  # already unwinding
        fired.append(signum)
        raise Stop(signum)

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def requeue(signum: int) -> str | None:
    """After a stop by SIGUSR1 under SLURM (``SLURM_JOB_ID`` set), ask SLURM to requeue the job
    (``scontrol requeue <id>``), so that the same command runs again and continues the run. Returns
    what to tell the user, or None when nothing was asked (another signal, or no SLURM job)."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    if signum != REQUEUE_SIGNAL or not job_id:
        return None
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"SLURM job {job_id} was not requeued: scontrol is not on PATH; submit the same command again"
    try:
        done = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SLURM job {job_id} was not requeued ({exc}); submit the same command again"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[0] if lines else f"exit {done.returncode}"
        return f"SLURM job {job_id} was not requeued (scontrol: {why}); submit the same command again"
    return f"SLURM job {job_id} requeued: it runs the same command again, which continues the run"


def name(signum: int) -> str:
    """How a message names the signal: Ctrl-C for SIGINT, else its name (SIGTERM)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
