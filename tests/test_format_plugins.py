"""Data formats registered by plugins, as components are: one file registers a format's name, its
traits and its reader (tfbuilder.data.readers.register_format), and the schema, prepare, fit and
predict all know it; an unknown format name gets a did-you-mean over the registered ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ONE_LAYER, QUICKSTART, short_run
from test_store import corpus, section
from tfbuilder import plugins
from tfbuilder.cli.commands import main
from tfbuilder.data import readers, text
from tfbuilder.data.prepare import prepare
from tfbuilder.errors import DataError
from tfbuilder.registry import RegistryError
from tfbuilder.spec import formats
from tfbuilder.spec.sections import DataSection

PLUGIN = '''
"""A toy data format: source|||target on each line of <stem>.pipe (a test plugin)."""

from tfbuilder.data import text
from tfbuilder.data.readers import register_format
from tfbuilder.errors import DataError


@register_format("pipe", suffix="pipe", description="<stem>.pipe[.gz]: source|||target on each line")
def pipe_rows(path, fields, *, numbers=()):
    for number, line in enumerate(text.lines(path), start=1):
        parts = line.split("|||") if len(fields) == 2 else [line]
        if len(parts) != len(fields):
            raise DataError(f"{path}:{number}: expected source|||target")
        yield tuple(parts)
'''


@pytest.fixture
def plugin(tmp_path):
    """The plugin file; what it registered is forgotten afterwards, as if the process ended."""
    path = tmp_path / "pipe_format.py"
    path.write_text(PLUGIN)
    yield path
    if "pipe" in formats.names():
        readers.unregister_format("pipe")
    plugins._loaded.clear()


def pipes(folder: Path, out: Path) -> Path:
    """The parallel text corpus in ``folder`` rewritten as ``<split>.pipe`` files in ``out``."""
    out.mkdir()
    for split in ("train", "val", "test"):
        de, en = text.read_lines(folder / f"{split}.de"), text.read_lines(folder / f"{split}.en")
        (out / f"{split}.pipe").write_text("".join(f"{s}|||{t}\n" for s, t in zip(de, en, strict=True)))
    return out


def test_a_plugin_format_gives_the_same_store_as_text_files(tmp_path, plugin):
    plugins.load([str(plugin)])
    traits = formats.get("pipe")
    assert traits.plugin == str(plugin.resolve()) and traits.suffixes == (".pipe",) and not traits.columns
    assert formats.names()[:6] == ["text", "jsonl", "csv", "tsv", "parquet", "datasets"]
    folder = corpus(tmp_path / "text", gz=False)
    plain = prepare(section(folder, cache=str(tmp_path / "stores")))
    got = prepare(section(pipes(folder, tmp_path / "pipe"), format="pipe", src_lang=None, tgt_lang=None))
    assert got.vocab.to_json() == plain.vocab.to_json()
    for name in ("train", "val", "test"):
        assert got.splits[name].src.tolist() == plain.splits[name].src.tolist()
        assert got.splits[name].tgt.tolist() == plain.splits[name].tgt.tolist()
    assert readers.file_reader(Path("inputs.pipe.gz")) is readers.reader("pipe")  # predict --input reads it too


def test_a_plugin_format_is_checked_by_the_schema_and_its_reader(tmp_path, plugin):
    plugins.load([str(plugin)])
    with pytest.raises(Exception, match="columns name fields of records: set format to jsonl, csv, tsv, parquet or datasets"):
        section(tmp_path, format="pipe", columns={"source": "de", "target": "en"})
    with pytest.raises(Exception, match="labelled data is read from records"):
        DataSection(type="labelled", path="x", format="pipe", tokenizer={"type": "bpe", "vocab_size": 300})
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "train.pipe").write_text("ein Haus|||a house\nkaputt\n")
    (folder / "val.pipe").write_text("ein Haus|||a house\n")
    with pytest.raises(DataError, match=r"train\.pipe:2: expected source\|\|\|target"):
        prepare(section(folder, format="pipe", src_lang=None, tgt_lang=None))


def test_a_format_name_is_registered_once(plugin):
    plugins.load([str(plugin)])
    with pytest.raises(RegistryError, match="data format 'pipe' is already registered by"):
        readers.register_format("pipe", suffix="p", description="again")(lambda path, fields, *, numbers=(): iter(()))
    with pytest.raises(RegistryError, match="data format 'jsonl' is already registered"):
        readers.register_format("jsonl", suffix="j", description="again")(lambda path, fields, *, numbers=(): iter(()))


def sets(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def test_validate_and_fit_with_a_format_from_plugins(tmp_path, plugin, capsys):
    folder = pipes(corpus(tmp_path / "text", train=64, gz=False), tmp_path / "pipe")
    data = [
        "data.type=parallel", f"data.path={folder}", "data.format=pipe", f"data.cache={tmp_path / 'stores'}",
        "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280", "data.max_tokens=400",
    ]
    recipe = ONE_LAYER + short_run(tmp_path, "trainer.max_steps=2", "trainer.val_every=2") + data
    assert main(["validate", str(QUICKSTART), *sets(*recipe)]) == 2  # without the plugin: an unknown format
    err = capsys.readouterr().err
    assert "data.format: unknown format; expected one of: 'csv', 'datasets', 'jsonl', 'parquet', 'text', 'tsv'" in err

    assert main(["validate", str(QUICKSTART), *sets(*recipe, "data.format=pipr"), "--plugins", str(plugin)]) == 2
    assert "data.format: unknown format; did you mean 'pipe'? (got 'pipr')" in capsys.readouterr().err

    assert main(["validate", str(QUICKSTART), *sets(*recipe), "--plugins", str(plugin)]) == 0
    assert main(["fit", str(QUICKSTART), *sets(*recipe), "--plugins", str(plugin)]) == 0
    (run_dir,) = (tmp_path / "runs" / "quickstart").iterdir()
    assert (run_dir / "checkpoints").is_dir()
