"""The trained models that tests share, each trained once per test run.

They train in one process beside the test run, started once the tests are collected (only when a
selected test needs one; conftest.py); the tests that need them run last, so the rest of the suite
runs meanwhile on the other core. One thread each: the test process keeps the other core, and what
they learn does not depend on the machine's load.

Under pytest-xdist every worker collects the same tests and asks for the same runs: the workers share
one folder (the controller makes it, conftest.py), the first to take its lock starts the training
process and the others wait on the files it writes, so a run is trained once however many workers
there are. The training process holds a lock on ``alive`` for as long as it lives (the kernel drops it
when the process ends, however it ends): a waiter that can take that lock while ``<name>.done`` is
missing knows the training died.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"

TRAINED = {
    # recipes/quickstart.yaml as shipped (on one thread): the README's promise is tested on it; the
    # decoding tests and the attention maps use it as their trained model.
    "quickstart_run": [],
}
TRAIN_ORDER = ["quickstart_run"]

# Trains each named run in turn, marking each as done (with its exit status) once fit has returned.
TRAINER = r"""
import json, os, sys
from tfbuilder.cli.commands import main
for name, args in json.loads(sys.argv[1]):
    status = main(args)
    with open(os.path.join(sys.argv[2], name + ".part"), "w") as f:
        f.write(str(status))
    os.replace(os.path.join(sys.argv[2], name + ".part"), os.path.join(sys.argv[2], name + ".done"))
"""


def _alive(folder: Path) -> bool:
    """Whether the training process of ``folder`` still holds its ``alive`` lock."""
    with open(folder / "alive", "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


class Trained:
    """The process that trains the TRAINED runs a test run needs, and where each lands.

    ``shared``: a folder the xdist workers of this test run share (None: a folder of this process's
    own, removed by ``close``)."""

    def __init__(self, names: list[str], shared: Path | None = None):
        self.names = names
        self.shared = shared is not None
        if shared is None:
            self.folder = Path(tempfile.mkdtemp(prefix="tfbuilder-trained-"))
        else:
            self.folder = shared / "+".join(names)
            self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "start.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts the training; the others find it started
            if not (self.folder / "started").exists():
                self._start()

    def _start(self) -> None:
        jobs = []
        for name in self.names:
            sets = [f"trainer.output={self.folder / name}", "trainer.progress=false", "trainer.threads=1"]
            sets += TRAINED[name]
            jobs.append((name, ["fit", str(QUICKSTART), *sum((["--set", o] for o in sets), [])]))
        with open(self.folder / "alive", "a+b") as alive, open(self.folder / "trainer.log", "w") as log:
            fcntl.flock(alive, fcntl.LOCK_EX)  # handed to the child with the descriptor; held while it lives
            process = subprocess.Popen(
                [sys.executable, "-c", TRAINER, json.dumps(jobs), str(self.folder)],
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(alive.fileno(),),
            )
        self.process = process
        (self.folder / "started").write_text(str(process.pid))

    def run_dir(self, name: str) -> Path:
        """Wait until ``name`` is trained; its run directory."""
        done = self.folder / f"{name}.done"
        while not done.exists():
            if getattr(self, "process", None) is not None:
                self.process.poll()  # reap it if it has ended, so that its lock is gone
            if not _alive(self.folder):
                break
            time.sleep(0.2)
        if not done.exists() or done.read_text() != "0":
            pytest.fail(f"training {name} failed:\n{(self.folder / 'trainer.log').read_text()[-5000:]}")
        (run,) = (self.folder / name / "quickstart").iterdir()
        return run

    def close(self) -> None:
        """Stop the training if it is still going and remove its folder; a shared folder is left to
        the controller (``close_shared``), as other workers may still read it."""
        if self.shared:
            return
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def close_shared(shared: Path) -> None:
    """At the end of an xdist test run (every worker done): stop any training still going, remove the folder."""
    for started in shared.glob("*/started"):
        if _alive(started.parent):
            try:
                os.kill(int(started.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(shared, ignore_errors=True)
