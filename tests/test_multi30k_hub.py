"""The shipped Multi30k recipes read the Hugging Face Hub (bentrevett/multi30k: splits train, validation, test;
columns en and de). Here the Hub is stood in for by a saved dataset of the same splits and columns, made from
the committed stand-in corpus: each recipe validates, and its data prepares, from another working directory."""

from __future__ import annotations

import pytest

from conftest import MULTI30K_FIXTURE, RECIPES, ROOT
from tfbuilder import load_recipe
from tfbuilder.cli.commands import main
from tfbuilder.data import arrow, text

datasets = pytest.importorskip("datasets")

HUB_NAME = "bentrevett/multi30k"
SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}  # Hub split -> the files' stem


def reads_multi30k(path) -> bool:
    data = load_recipe(path).data
    return data is not None and data.hub is not None and data.hub.name == HUB_NAME


HUB_RECIPES = [p for p in RECIPES if reads_multi30k(p)]
NAMED = [ROOT / "recipes" / name for name in ("decoder-lm.yaml", "encoder-mlm.yaml", "multi30k/vanilla-small.yaml")]


def _data(path) -> str:
    return repr(load_recipe(path).data.model_dump())


# The named recipes, and one more per other distinct data section: preparing is what differs between them.
PREPARED = list(NAMED)
for _path in HUB_RECIPES:
    if _data(_path) not in {_data(p) for p in PREPARED}:
        PREPARED.append(_path)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The Hub's Multi30k, stood in for by a saved DatasetDict; the working directory is elsewhere."""
    columns = {
        split: {lang: text.read_lines(next(MULTI30K_FIXTURE.glob(f"{stem}.{lang}*"))) for lang in ("en", "de")}
        for split, stem in SPLITS.items()
    }
    folder = tmp_path / "hub"
    datasets.DatasetDict({split: datasets.Dataset.from_dict(c) for split, c in columns.items()}).save_to_disk(str(folder))
    asked = []

    def load_hub(name, config, revision):
        asked.append((name, config, revision))
        return datasets.load_from_disk(str(folder))

    monkeypatch.setattr(arrow, "load_hub", load_hub)
    monkeypatch.chdir(tmp_path)
    return asked


def test_the_shipped_multi30k_recipes_read_the_hub_not_a_folder():
    names = {str(p.relative_to(ROOT / "recipes")) for p in HUB_RECIPES}
    assert {"decoder-lm.yaml", "encoder-mlm.yaml", "multi30k/vanilla-small.yaml"} <= names
    for path in RECIPES:
        assert "shared/data" not in path.read_text(encoding="utf-8"), path


def test_the_hub_recipes_validate_from_another_working_directory(hub, capsys):
    assert main(["validate", *map(str, HUB_RECIPES)]) == 0
    assert capsys.readouterr().out.count(": OK") == len(HUB_RECIPES)


@pytest.mark.parametrize("path", PREPARED, ids=[str(p.relative_to(ROOT / "recipes")) for p in PREPARED])
def test_the_hub_recipes_data_prepares(hub, path, tmp_path, capsys):
    small = ["--set", "data.tokenizer.vocab_size=300", "--set", f"data.cache={tmp_path / 'cache'}"]
    assert main(["prepare", str(path), *small]) == 0
    assert hub == [(HUB_NAME, None, None)]
    out = capsys.readouterr().out
    assert "train" in out and "val" in out
