"""Checkpoints are hostile input: a stored recipe is bounded and its size checked before anything is
built; damaged files (bytes flipped, truncated, zip entries dropped) end in exit 2, quickly, in bounded memory."""

from __future__ import annotations

import io
import random
import zipfile
from pathlib import Path

import pytest
import torch

import tfbuilder
from conftest import QUICKSTART
from hostile import assert_refused, run_cli, run_limited
from tfbuilder.builder import build_model
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.synthetic import alphabet
from tfbuilder.data.tokenizers import CharTokenizer

SMALL = ["model.d_model=16", "model.attention.heads=2", "model.ffn.hidden=16", "model.encoder.layers=1", "model.decoder.layers=1"]


def _data(**recipe_changes) -> dict:
    """A checkpoint's contents: the tiny quick-start model, its recipe changed by ``recipe_changes``
    (dotted keys) after the weights were made."""
    recipe = tfbuilder.load_recipe(QUICKSTART, [*SMALL, "data.test_size=4", "data.val_size=4"])
    vocab = Vocab(CharTokenizer(alphabet(10)), CharTokenizer(alphabet(10)))
    model = build_model(recipe)
    stored = recipe.to_dict()
    for dotted, value in recipe_changes.items():
        node = stored
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    meta = {"recipe": stored, "vocab": vocab.to_json()}
    return {"tfbuilder": meta, "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "global_step": 3}


def _save(tmp_path: Path, data: dict) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    path = run / "checkpoints" / "last.ckpt"
    torch.save(data, path)
    return path


# --- a stored recipe is checked like a recipe file -------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [{"model.ffn.hidden": 10**8}, {"model.d_model": 2**16, "model.attention.heads": 2}, {"model.position": {"type": "sinusoidal", "max_len": 10**6}, "model.d_model": 2**14, "model.attention.heads": 2}],
    ids=["wide-ffn", "wide-model", "huge-table"],
)
def test_a_stored_recipe_asking_for_a_huge_model_is_refused_before_it_is_built(tmp_path, changes):
    path = _save(tmp_path, _data(**changes))
    outcome = run_limited(["test", str(path)], cwd=tmp_path)
    assert_refused(outcome, str(path.name), "holds weights for", seconds=60)


def test_a_deeply_nested_stored_recipe_is_refused(tmp_path, capsys):
    data = _data()
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["x"] = {}
        node = node["x"]
    data["tfbuilder"]["recipe"]["model"]["extra"] = deep
    path = _save(tmp_path, data)
    assert_refused(run_cli(["test", str(path)], capsys), "nested deeper than 64 levels")


def test_sinusoidal_tables_are_bounded(tmp_path, capsys):
    outcome = run_cli(["validate", str(QUICKSTART), "--set", "model.position={type: sinusoidal, max_len: 1000000000000}"], capsys)
    assert_refused(outcome, "model.position.max_len", "less than or equal to 1000000")
