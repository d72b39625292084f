"""The pre-flight's look at the data's files (tfbuilder/train/preflight.py): what ``fit`` would refuse
before training (a missing folder or split file, a column data.columns misspells, a bad record among
the first ones, a tokenizer file that is not there) is refused by ``validate`` too, at the recipe's
key, and by ``fit`` before it creates anything; only the head of the training file is read, and
data on the Hugging Face Hub is never looked at. (The pre-flight's other rules are rows of
tests/test_validation_rules.py; the loggers' in tests/test_loggers.py.)"""

from __future__ import annotations

import json
import os

import pytest
import yaml

import tfbuilder
from conftest import ROOT, tiny_model
from hostile import assert_refused, run_cli
from tfbuilder.errors import RecipeError
from tfbuilder.train import preflight

RECORDS = [{"text": "a cat sat", "label": "pos"}, {"text": "a dog ran", "label": "neg"}]


def write_records(folder, fmt="csv", rows=RECORDS, splits=("train", "val")):
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        if fmt == "jsonl":
            content = "".join(json.dumps(r) + "\n" for r in rows)
        else:
            content = "text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in rows)
        (folder / f"{split}.{fmt}").write_text(content, encoding="utf-8")
    return folder


def write_recipe(file, **data):
    """A one-layer classifier of labelled records (validates in well under a second)."""
    model = tiny_model(kind="encoder", decoder=None, vocab_size=None, encoder={"layers": 1}, pad_id=0)
    model["head"] = {"type": "classify", "classes": 2}
    section = {
        "type": "labelled",
        "format": "csv",
        "path": "d",
        "columns": {"text": "text", "label": "label"},
        "tokenizer": {"type": "char", "vocab_size": 30},
        "batch_size": 2,
        **data,
    }
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump({"name": "r", "model": model, "data": section}, sort_keys=False), encoding="utf-8")
    return file


def validate(capsys, recipe, *args, cwd=None):
    return run_cli(["validate", str(recipe), *args], capsys, cwd=cwd)


def test_a_recipe_whose_data_is_there_validates(tmp_path, capsys):
    write_records(tmp_path / "d")
    outcome = validate(capsys, write_recipe(tmp_path / "r.yaml"))
    assert outcome.rc == 0 and outcome.out.endswith("r.yaml: OK\n"), outcome.err


def test_a_missing_data_folder_is_refused_by_validate_and_by_fit_before_it_creates_anything(tmp_path, capsys):
    recipe = write_recipe(tmp_path / "r.yaml", path="nowhere")
    line = "r.yaml:21:9: data.path: "  # the line and column where the recipe names the folder
    assert_refused(validate(capsys, recipe), line + f"data directory {tmp_path / 'nowhere'} does not exist")
    runs = tmp_path / "runs"
    outcome = run_cli(["fit", str(recipe), "--set", f"trainer.output={runs}"], capsys)
    assert_refused(outcome, line + "data directory")
    assert not runs.exists()
    # A file where the folder should be.
    (tmp_path / "nowhere").write_text("x")
    assert_refused(validate(capsys, recipe), line + f"{tmp_path / 'nowhere'} is a file, not a directory")


def test_the_folder_is_found_as_fit_finds_it_relative_to_the_recipe_or_else_the_working_directory(tmp_path, capsys):
    write_records(tmp_path / "a" / "d")
    assert validate(capsys, write_recipe(tmp_path / "a" / "r.yaml")).rc == 0  # from any working directory
    write_records(tmp_path / "d")  # only from the working directory: read, with fit's warning
    old_style = write_recipe(tmp_path / "b" / "r.yaml")
    with pytest.warns(FutureWarning, match=r"data\.path 'd' is relative to the recipe's folder"):
        assert validate(capsys, old_style, cwd=tmp_path).rc == 0
    assert_refused(validate(capsys, old_style), f"data directory {tmp_path / 'b' / 'd'} does not exist")


def test_a_missing_split_file_is_refused(tmp_path, capsys):
    write_records(tmp_path / "d", splits=("train",))
    outcome = validate(capsys, write_recipe(tmp_path / "r.yaml"))
    assert_refused(outcome, f"data.path: missing data file: {tmp_path / 'd' / 'val.csv'} (or val.csv.gz)")


@pytest.mark.parametrize(
    "fmt,message",
    [
        ("csv", "no column 'txt' in the header (data.columns); it has 'text', 'label'; did you mean 'text'?"),
        ("jsonl", "train.jsonl:1: no field 'txt' (data.columns); did you mean 'text'?"),
    ],
)
def test_a_misspelled_column_is_refused_at_its_key_with_a_suggestion(tmp_path, capsys, fmt, message):
    write_records(tmp_path / "d", fmt)
    recipe = write_recipe(tmp_path / "r.yaml", format=fmt, columns={"text": "txt", "label": "label"})
    assert_refused(validate(capsys, recipe), "r.yaml:23:11: data.columns.text: ", message)


def test_only_the_head_of_the_training_file_is_read(tmp_path, capsys):
    """A bad record among the first HEAD_ROWS is named by file and row; one after them is left to fit."""
    good = json.dumps(RECORDS[0]) + "\n"
    folder = write_records(tmp_path / "d", "jsonl")
    recipe = write_recipe(tmp_path / "r.yaml", format="jsonl")
    (folder / "train.jsonl").write_text(good + '{"text": "a", "label": null}\n', encoding="utf-8")
    assert_refused(validate(capsys, recipe), f"data.path: {folder / 'train.jsonl'}:2: field 'label' is null, not text")
    (folder / "train.jsonl").write_text(good * preflight.HEAD_ROWS + "not json\n", encoding="utf-8")
    assert validate(capsys, recipe).rc == 0


def test_data_on_the_hub_is_not_looked_at(capsys, monkeypatch):
    import datasets

    from tfbuilder.data import arrow

    def no_loading(*args, **kwargs):
        raise AssertionError("validation read data")

    for module, name in ((datasets, "load_dataset"), (datasets, "load_from_disk"), (arrow, "load_hub")):
        monkeypatch.setattr(module, name, no_loading)
    outcome = validate(capsys, ROOT / "recipes" / "wmt14" / "base.yaml")
    assert outcome.rc == 0, outcome.err


def test_no_data_skips_the_datas_files(tmp_path, capsys):
    recipe = write_recipe(tmp_path / "r.yaml", path="nowhere", tokenizer={"type": "pretrained", "path": "no.json", "vocab_size": 30})
    assert validate(capsys, recipe, "--no-data").rc == 0


def test_a_tokenizer_file_that_is_not_there_is_refused(tmp_path, capsys):
    """A recipe stating the vocabulary size loads without its tokenizer file (a checkpoint's does); training needs it."""
    write_records(tmp_path / "d")
    tokenizer = {"type": "pretrained", "path": str(tmp_path / "no.json"), "vocab_size": 30}
    recipe = write_recipe(tmp_path / "r.yaml", tokenizer=tokenizer)
    assert_refused(validate(capsys, recipe), f"data.tokenizer.path: no such file: {tmp_path / 'no.json'}")
    # A run that takes its vocabulary from a checkpoint (--resume, --init-from) does not need it.
    preflight.check(tfbuilder.load_recipe(recipe), vocab_given=True)
    with pytest.raises(RecipeError, match="no such file"):
        preflight.check_run(tfbuilder.load_recipe(recipe))


def test_a_tokenizer_path_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, capsys):
    write_records(tmp_path / "d")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # reading it would block
    recipe = write_recipe(tmp_path / "r.yaml", tokenizer={"type": "pretrained", "path": str(fifo), "vocab_size": 30})
    assert_refused(validate(capsys, recipe), f"data.tokenizer.path: {fifo} is not a regular file")
    recipe = write_recipe(tmp_path / "r.yaml", tokenizer={"type": "pretrained", "path": str(fifo)})
    assert_refused(validate(capsys, recipe), f"data.tokenizer.path: {fifo} is not a regular file")


# --- a strategy this machine cannot run -----------------------------------------------------------------


def test_fsdp_on_an_apple_gpu_is_refused_by_validate_and_fit(tmp_path, capsys):
    quickstart = str(ROOT / "recipes" / "quickstart.yaml")
    sets = ["--set", "trainer.strategy=fsdp", "--set", "trainer.accelerator=mps", "--set", f"trainer.output={tmp_path / 'runs'}"]
    why = "trainer.accelerator is mps (no process group reaches an Apple GPU)"
    assert_refused(run_cli(["validate", quickstart, *sets], capsys), "trainer.strategy: fsdp shards the model over CUDA GPUs or CPU processes", why)
    assert_refused(run_cli(["fit", quickstart, *sets], capsys), "trainer")  # here: no Apple GPU, first
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("accelerator", ["cpu", "auto"])
def test_fsdp_on_cpu_processes_validates(accelerator, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU, gloo
    quickstart = str(ROOT / "recipes" / "quickstart.yaml")
    sets = ["--set", "trainer.strategy=fsdp", "--set", f"trainer.accelerator={accelerator}"]
    outcome = run_cli(["validate", quickstart, *sets], capsys)
    assert outcome.rc == 0, outcome.err
