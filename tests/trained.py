"""The trained models that tests share, each trained once per test run.

They train in one process beside the test run, started once the tests are collected (only when a
selected test needs one; conftest.py); the tests that need them run last, so the rest of the suite
runs meanwhile on the other core. One thread each: the test process keeps the other core, and what
they learn does not depend on the machine's load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
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
from tfbuilder.cli import main
for name, args in json.loads(sys.argv[1]):
    status = main(args)
    with open(os.path.join(sys.argv[2], name + ".part"), "w") as f:
        f.write(str(status))
    os.replace(os.path.join(sys.argv[2], name + ".part"), os.path.join(sys.argv[2], name + ".done"))
"""


class Trained:
    """The process that trains the TRAINED runs a test run needs, and where each lands."""

    def __init__(self, names: list[str]):
        self.names = names
        self.folder = Path(tempfile.mkdtemp(prefix="tfbuilder-trained-"))
        jobs = []
        for name in names:
            sets = [f"trainer.output={self.folder / name}", "trainer.progress=false", "trainer.threads=1"]
            sets += TRAINED[name]
            jobs.append((name, ["fit", str(QUICKSTART), *sum((["--set", o] for o in sets), [])]))
        self.log = open(self.folder / "trainer.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", TRAINER, json.dumps(jobs), str(self.folder)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def run_dir(self, name: str) -> Path:
        """Wait until ``name`` is trained; its run directory."""
        done = self.folder / f"{name}.done"
        while not done.exists() and self.process.poll() is None:
            try:
                self.process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        if not done.exists() or done.read_text() != "0":
            pytest.fail(f"training {name} failed:\n{(self.folder / 'trainer.log').read_text()[-5000:]}")
        (run,) = (self.folder / name / "quickstart").iterdir()
        return run

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
