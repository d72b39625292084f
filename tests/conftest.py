"""Shared fixtures: paths, tiny recipes, deterministic seeds, and trained runs made once per test run."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tfbuilder import devices

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
# Multi30k lies beside the clone here and in CI; elsewhere point MULTI30K_DIR at a copy (docs/multi30k.md, "Data").
MULTI30K = Path(os.environ.get("MULTI30K_DIR", ROOT.parent / "shared" / "data" / "multi30k"))

# The smallest model that still has every part: used wherever a test needs "some model".
TINY_MODEL = {
    "kind": "encoder_decoder",
    "vocab_size": 53,
    "d_model": 32,
    "dropout": 0.0,
    "attention": {"type": "multihead", "heads": 4},
    "ffn": {"type": "mlp", "hidden": 48},
    "encoder": {"layers": 2},
    "decoder": {"layers": 2},
}


def tiny_model(**changes) -> dict:
    """A copy of TINY_MODEL with ``changes`` applied (None removes a key)."""
    spec = copy.deepcopy(TINY_MODEL)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# The real measurement, for the tests of it (the fixture below replaces it during a test run).
MEASURE_BUSY_CORES = devices.busy_cores


@pytest.fixture(scope="session", autouse=True)
def _one_training_thread():
    """``trainer.threads: auto`` gives one thread to every run trained in the test process, as if
    all cores but one were busy (the trained runs below, and subprocesses, use the others): a model
    trained in a test is the same whatever the machine's load, and no fit spends 0.25 s measuring it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(devices, "busy_cores", lambda seconds=0.25, **_: float(devices.usable_cores() - 1))
        yield


# The trained models that tests share, each trained once per test run. They train in one process
# beside the test run, started once the tests are collected (only when a selected test needs
# one); the tests that need them run last, so the rest of the suite runs meanwhile on the other
# core. One thread each: the test process keeps the other core, and results do not depend on load.
TRAINED = {
    # recipes/quickstart.yaml as shipped (on one thread): the README's promise is tested on it; the
    # attention maps use it as their trained model.
    "quickstart_run": [],
    # A copy-task model for the decoding tests (pre-norm, 600 steps).
    "copy_run": [
        "model.placement=pre",
        "data.train_size=4000",
        "data.lengths=[1, 10]",
        "trainer.max_steps=600",
        "trainer.val_every=600",
    ],
}
TRAIN_ORDER = ["copy_run", "quickstart_run"]  # the shorter first: its tests can start sooner

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
            sets = [f"trainer.output={self.folder / name}", "trainer.progress=false", "trainer.threads=1", *TRAINED[name]]
            jobs.append((name, ["fit", str(QUICKSTART), *sum((["--set", o] for o in sets), [])]))
        self.log = open(self.folder / "trainer.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", TRAINER, json.dumps(jobs), str(self.folder)], stdout=self.log, stderr=subprocess.STDOUT
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


_trained: list[Trained] = []


def _needs(item: pytest.Item) -> list[str]:
    return [name for name in TRAIN_ORDER if name in getattr(item, "fixturenames", ())]


@pytest.fixture(scope="session")
def quickstart_run() -> Path:
    """The run directory of recipes/quickstart.yaml trained as shipped (see TRAINED). A test that
    writes into a run directory copies it first."""
    return _wait_for("quickstart_run")


@pytest.fixture(scope="session")
def copy_run() -> Path:
    """The run directory of a copy-task model (see TRAINED)."""
    return _wait_for("copy_run")


def _wait_for(name: str) -> Path:
    trainer = next((t for t in _trained if name in t.names), None)
    if trainer is None:  # e.g. requested through getfixturevalue, unseen at collection
        trainer = Trained([name])
        _trained.append(trainer)
    return trainer.run_dir(name)


def pytest_sessionfinish(session, exitstatus):
    while _trained:
        _trained.pop().close()


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run wherever CUDA is present; elsewhere they are reported as skipped.
    Modules whose tests need a TRAINED run go last (in TRAIN_ORDER), and its training starts now."""
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    needed = {name for item in items for name in _needs(item)}
    if not needed or config.option.collectonly:
        return
    # Whole modules move, so that their module-scoped fixtures are still made once.
    rank = {}
    for item in items:
        for name in _needs(item):
            rank[item.module] = max(rank.get(item.module, 0), 1 + TRAIN_ORDER.index(name))
    items.sort(key=lambda item: rank.get(getattr(item, "module", None), 0))
    _trained.append(Trained([name for name in TRAIN_ORDER if name in needed]))
