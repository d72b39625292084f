"""Shared fixtures: paths, tiny recipes, deterministic seeds, and trained runs made once per test run."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

from tfbuilder import devices
from trained import TRAIN_ORDER, Trained

ROOT = Path(__file__).resolve().parent.parent
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


QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
# The quick-start model at its smallest: one layer a side, width 32.
ONE_LAYER = ["model.d_model=32", "model.attention.heads=2", "model.ffn.hidden=32", "model.encoder.layers=1", "model.decoder.layers=1"]


def short_run(tmp_path, *overrides: str, train: int = 2000, val: int = 200, longest: int = 8) -> list[str]:
    """Overrides that make the quick-start recipe a short run writing under ``tmp_path``: ``train``
    and ``val`` examples of 1 to ``longest`` symbols, then ``overrides``."""
    return [
        f"trainer.output={tmp_path / 'runs'}",
        "trainer.progress=false",
        f"data.train_size={train}",
        f"data.val_size={val}",
        f"data.lengths=[1, {longest}]",
        *overrides,
    ]


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
    all cores but one were busy (the shared trained runs and subprocesses use the others): a model
    trained in a test is the same whatever the machine's load, and no fit spends 0.25 s measuring it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(devices, "busy_cores", lambda seconds=0.25, **_: float(devices.usable_cores() - 1))
        yield


_trained: list[Trained] = []


def _needs(item: pytest.Item) -> list[str]:
    return [name for name in TRAIN_ORDER if name in getattr(item, "fixturenames", ())]


@pytest.fixture(scope="session")
def quickstart_run() -> Path:
    """The run directory of recipes/quickstart.yaml trained as shipped (trained.py). A test that
    writes into a run directory copies it first."""
    return _wait_for("quickstart_run")


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
    Modules whose tests need a shared trained run go last (in TRAIN_ORDER), and training starts now."""
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
