"""Shared fixtures: paths, tiny recipes, deterministic seeds."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run wherever CUDA is present; elsewhere they are reported as skipped."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
