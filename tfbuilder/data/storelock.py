"""The lock that makes concurrent preparers of one store wait for the one that prepares it (sweeps,
DDP ranks, several jobs on one shared file system): an exclusive ``flock`` on ``<root>/<key>.lock``,
opened without following a link or blocking on a FIFO. The holder writes who it is into the lock file
and renews its modification time while it works; a waiter says who holds the lock and since when, and
gives up after ``$TFBUILDER_LOCK_TIMEOUT`` seconds without a sign of life (see docs/data.md)."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tfbuilder.errors import DataError, printable
from tfbuilder.streams import open_own

LOCK_TIMEOUT_ENV = "TFBUILDER_LOCK_TIMEOUT"
LOCK_TIMEOUT = 30 * 60  # seconds a preparer waits for a lock whose holder shows no sign of life
LOCK_RENEW = 5.0  # seconds between a holder's signs of life (the lock file's modification time renewed)


@contextmanager
def locked(path: Path, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed, a plain file of its own: never a link
    followed, a FIFO opened or a folder taken). The holder's pid, host and start time are written into
    the lock file, and its modification time is renewed every :data:`LOCK_RENEW` seconds while it is
    held. When another process holds it, ``say`` hears once who and since when, and this one waits as
    long as the holder renews it; after ``$TFBUILDER_LOCK_TIMEOUT`` seconds (30 minutes) without a
    renewal (a holder stopped with Ctrl-Z) it gives up with a :class:`DataError` naming the lock and
    its holder."""
    timeout = lock_timeout()
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            (say or print)(
                f"data: waiting for {holder} to finish preparing this data (lock {path}); giving up if it "
                f"shows no sign of life for {_duration(timeout)} (${LOCK_TIMEOUT_ENV}, in seconds)"
            )
            _wait(fd, path, timeout)
        except OSError as exc:
            raise DataError(f"cannot lock {path}: {exc.strerror or exc}") from None
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
        stop = threading.Event()
        renewer = threading.Thread(target=_renew, args=(fd, stop), name="tfbuilder-store-lock", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _renew(fd: int, stop: threading.Event) -> None:
    """A holder's sign of life: the lock file's modification time, renewed until ``stop``."""
    while not stop.wait(LOCK_RENEW):
        try:
            os.utime(fd)
        except OSError:
            return


def lock_timeout() -> float:
    """Seconds a preparer waits for a held lock: ``$TFBUILDER_LOCK_TIMEOUT``, else 30 minutes."""
    value = os.environ.get(LOCK_TIMEOUT_ENV)
    if not value:
        return LOCK_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise DataError(f"${LOCK_TIMEOUT_ENV} is {value!r}: give the seconds to wait for a store's lock (e.g. 1800)")
    return seconds


def _open_lock(path: Path) -> int:
    advice = "tfbuilder writes nothing there; move it away (or set data.cache to another folder), then try again"
    try:
        fd, what = open_own(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise DataError(f"cannot create the lock file {path}: {exc.strerror or exc} (set data.cache)") from None
    if fd is None:
        raise DataError(f"{path} is {what}, not a lock file: {advice}")
    return fd


def _holder(fd: int) -> str:
    """Who holds the lock, as the holder wrote it into the lock file ("another process" when unsaid)."""
    try:
        line = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        line = ""
    return printable(line) if line.startswith("pid ") and "\n" not in line else "another process"


def _wait(fd: int, path: Path, timeout: float) -> None:
    """Wait for the lock as long as its holder renews it; give up after ``timeout`` seconds without."""
    seen = os.fstat(fd).st_mtime_ns
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        renewed = os.fstat(fd).st_mtime_ns
        if renewed != seen:  # a sign of life (compared, not read as a time: the holder's clock may differ)
            seen, deadline = renewed, time.monotonic() + timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise DataError(
                f"gave up waiting for the lock {path}, held by {_holder(fd)}, which has shown no sign of life "
                f"for {_duration(timeout)}: if that process is stopped (Ctrl-Z), resume it (fg) or end it; "
                f"if it is busy, wait longer (${LOCK_TIMEOUT_ENV}, in seconds); then try again"
            )
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s"
