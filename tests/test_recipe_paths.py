"""A recipe file's data.path is relative to that file's folder (as extends is), from any working directory;
--set values and recipes built in Python stay relative to the working directory; for one release, a folder
that exists only from the working directory is still read, with a warning; the run records the resolved path."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml

from conftest import tiny_model
from tfbuilder import fit, load_recipe, recipe_from_dict
from tfbuilder.cli.commands import main
from tfbuilder.data.prepare import prepare
from tfbuilder.errors import RecipeError

LINES = ["a dog runs on the grass", "two men play ball", "a girl in red", "the cat sleeps", "a man rides a horse"]


def write_data(folder, n=4):
    folder.mkdir(parents=True)
    for stem in ("train", "val", "test"):
        (folder / f"{stem}.en").write_text("\n".join(LINES[:n]) + "\n", encoding="utf-8")
    return folder


def recipe_dict(**data) -> dict:
    model = tiny_model(kind="decoder", encoder=None, vocab_size=None)
    section = {"type": "monolingual", "lang": "en", "tokenizer": {"type": "char", "vocab_size": 20}, **data}
    return {"name": "r", "model": model, "data": section}


def write_recipe(file, **data):
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump(recipe_dict(**data)), encoding="utf-8")
    return file


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory that is not the recipe's folder (monkeypatch restores the old one)."""
    cwd = tmp_path / "w"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_data_path_is_read_relative_to_the_recipe_file(tmp_path, elsewhere):
    data = write_data(tmp_path / "a" / "d")
    write_data(elsewhere / "d", n=2)  # the same relative path from the working directory: not read
    recipe = load_recipe(write_recipe(tmp_path / "a" / "r.yaml", path="d"))
    assert recipe.data.path == str(data)
    prepared = prepare(recipe.data, say=lambda _: None)
    assert len(prepared.splits["train"]) == 4  # the recipe's folder, not the working directory's (2 lines)


def test_a_parents_data_path_is_relative_to_the_parent(tmp_path, elsewhere):
    write_recipe(tmp_path / "p" / "parent.yaml", path="d")
    child = tmp_path / "c" / "child.yaml"
    child.parent.mkdir()
    child.write_text("name: child\nextends: ../p/parent.yaml\ntrainer: {max_steps: 3}\n", encoding="utf-8")
    assert load_recipe(child).data.path == str(tmp_path / "p" / "d")
    # A child that sets it: relative to the child's folder; a deeper chain keeps the parent's value.
    child.write_text("name: child\nextends: ../p/parent.yaml\ndata: {path: e}\n", encoding="utf-8")
    assert load_recipe(child).data.path == str(tmp_path / "c" / "e")
    grandchild = tmp_path / "g" / "deep" / "gc.yaml"
    grandchild.parent.mkdir(parents=True)
    grandchild.write_text("extends: ../../p/parent.yaml\n", encoding="utf-8")
    assert load_recipe(grandchild).data.path == str(tmp_path / "p" / "d")


def test_set_and_absolute_paths_and_python_recipes_are_as_given(tmp_path, elsewhere):
    write_data(elsewhere / "x", n=3)
    recipe = load_recipe(write_recipe(tmp_path / "a" / "r.yaml", path="d"), ["data.path=x"])
    assert recipe.data.path == "x" and recipe.data.written_path is None  # typed here: the working directory's
    assert len(prepare(recipe.data, say=lambda _: None).splits["train"]) == 3
    absolute = load_recipe(write_recipe(tmp_path / "b" / "r.yaml", path=str(elsewhere / "x")))
    assert absolute.data.path == str(elsewhere / "x")
    assert recipe_from_dict(recipe_dict(path="x")).data.path == "x"


def test_an_old_style_path_is_still_read_with_a_warning(tmp_path, elsewhere):
    write_data(elsewhere / "d")  # where the path pointed before: from the working directory
    recipe = load_recipe(write_recipe(tmp_path / "a" / "r.yaml", path="d"))
    with pytest.warns(FutureWarning, match=r"r\.yaml: data\.path 'd' .* write data\.path: \.\./w/d"):
        prepared = prepare(recipe.data, say=lambda _: None)
    assert len(prepared.splits["train"]) == 4
    assert recipe.data.path == str(elsewhere / "d")  # what the run records


def test_neither_folder_names_the_recipe_relative_one(tmp_path, elsewhere):
    from tfbuilder.errors import DataError

    recipe = load_recipe(write_recipe(tmp_path / "a" / "r.yaml", path="d"))
    with pytest.raises(DataError, match=f"data directory {tmp_path / 'a' / 'd'} does not exist"):
        prepare(recipe.data, say=lambda _: None)


@pytest.mark.parametrize("old_style", [False, True], ids=["recipe-relative", "old-style"])
def test_the_run_records_the_resolved_path(tmp_path, elsewhere, old_style, monkeypatch):
    data = write_data((elsewhere if old_style else tmp_path / "a") / "d")
    recipe = load_recipe(
        write_recipe(tmp_path / "a" / "r.yaml", path="d"),
        [
            f"trainer.output={tmp_path / 'runs'}",
            f"data.cache={tmp_path / 'cache'}",
            "data.batch_size=2",
            "data.workers=0",
            "trainer.max_steps=1",
            "trainer.val_every=1",
            "trainer.progress=false",
            "trainer.threads=1",
            "trainer.accelerator=cpu",
            "trainer.devices=1",
        ],
    )
    with pytest.warns(FutureWarning) if old_style else contextlib.nullcontext():
        summary = fit(recipe)
    recorded = yaml.safe_load((Path(summary.run_dir) / "recipe.yaml").read_text(encoding="utf-8"))
    assert recorded["data"]["path"] == str(data)
    # Resumed from yet another folder, the run still finds its data.
    monkeypatch.chdir(tmp_path / "a")
    assert main(["fit", "--resume", str(summary.run_dir), "--set", "trainer.max_steps=2"]) == 0



def test_a_sweeps_seeded_copies_read_the_old_style_folder_too(tmp_path, elsewhere):
    from tfbuilder.use.sweeps import plan

    write_data(elsewhere / "d")
    recipe = write_recipe(tmp_path / "a" / "r.yaml", path="d")
    with pytest.warns(FutureWarning, match=r"r\.yaml: data\.path 'd'"):
        sweep = plan([recipe], seeds=2, out=tmp_path / "sweep")
    assert [run.recipe.data.path for run in sweep.runs] == [str(elsewhere / "d")] * 2


# --- data.tokenizer.path: the same rule --------------------------------------------------------------


def tokenizer_recipe(file: Path, path: str) -> Path:
    """A recipe file whose given tokenizer (a BERT-style tokenizer.json) is at ``path``."""
    return write_recipe(file, path="d", tokenizer={"type": "pretrained", "path": path})


def test_a_tokenizer_path_is_relative_to_the_recipe_file(tmp_path, elsewhere):
    from test_pretrained import hf_tokenizer_file

    (tmp_path / "a" / "tok").mkdir(parents=True)
    mine = hf_tokenizer_file(tmp_path / "a" / "tok" / "tokenizer.json", ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    (elsewhere / "tok").mkdir()  # the same relative path from the working directory: not read
    hf_tokenizer_file(elsewhere / "tok" / "tokenizer.json", ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], last=True)
    recipe = load_recipe(tokenizer_recipe(tmp_path / "a" / "r.yaml", "tok/tokenizer.json"))
    assert recipe.data.tokenizer.path == str(mine)
    assert recipe.data.vocab_size == recipe.data.tokenizer.facts().vocab_size  # read from there while validating
    # --set stays relative to the working directory.
    overridden = load_recipe(tmp_path / "a" / "r.yaml", ["data.tokenizer.path=tok/tokenizer.json"])
    assert overridden.data.tokenizer.path == "tok/tokenizer.json"


def test_an_old_style_tokenizer_path_is_still_read_with_a_warning(tmp_path, elsewhere):
    from test_pretrained import hf_tokenizer_file

    (elsewhere / "tok").mkdir()
    old = hf_tokenizer_file(elsewhere / "tok" / "tokenizer.json", ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    file = tokenizer_recipe(tmp_path / "a" / "r.yaml", "tok/tokenizer.json")
    pattern = r"r\.yaml: data\.tokenizer\.path 'tok/tokenizer\.json' .* write data\.tokenizer\.path: \.\./w/tok/tokenizer\.json"
    with pytest.warns(FutureWarning, match=pattern):
        recipe = load_recipe(file)
    assert recipe.data.tokenizer.path == str(old)  # what the run records
    # Neither there: the problem names the recipe-relative file.
    old.unlink()
    with pytest.raises(RecipeError, match=str(tmp_path / "a" / "tok" / "tokenizer.json")):
        load_recipe(file)
