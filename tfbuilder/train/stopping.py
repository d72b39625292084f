"""Ctrl-C and SIGTERM outside the training loop: start-up unwinds cleanly (no Lightning here).

While a fit prepares (reads checkpoints, prepares data, sets up its run directory) the first SIGINT
or SIGTERM raises :class:`Stop`, which unwinds what was under way (atomic writes remove their
temporary files, the run's lock is released) and becomes an exit status of 128 + the signal with a
message saying what was kept. Further signals while it unwinds are ignored. Once training starts,
the training loop's own handler (callbacks.RunGuard) takes over: it validates and checkpoints the
current step before stopping.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


def name(signum: int) -> str:
    """How a message names the signal: Ctrl-C for SIGINT, else its name (SIGTERM)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
