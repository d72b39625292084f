"""Parquet files and Hugging Face datasets (tfbuilder/data/arrow.py): the same store as the equivalent
text files, prepared again exactly when the source changes, and every bad source named by file or
split and row before anything trains. Offline: the datasets are written here, the Hub is stood in for."""

from __future__ import annotations

import os
from pathlib import Path

import datasets  # the test extra installs pyarrow and datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import QUICKSTART
from test_store import corpus, last, said, section  # noqa: F401 (said: a fixture)
from tfbuilder.cli.commands import main
from tfbuilder.data import arrow, readers, store, text
from tfbuilder.data.prepare import prepare
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection

datasets.disable_progress_bars()
COLUMNS = {"source": "translation.de", "target": "translation.en"}
SPLITS = ("train", "val", "test")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No test reaches the Hub: those that load a Hub dataset stand in for load_dataset themselves."""

    def hub(*args, **kwargs):
        raise AssertionError("a test reached for the Hub")

    monkeypatch.setattr(datasets, "load_dataset", hub)


def pairs(folder: Path, split: str) -> list[dict]:
    """The split of a text corpus as WMT-style rows: {"translation": {"de": ..., "en": ...}}."""
    de, en = text.read_lines(folder / f"{split}.de"), text.read_lines(folder / f"{split}.en")
    return [{"id": i, "translation": {"de": s, "en": t}} for i, (s, t) in enumerate(zip(de, en))]


def parquet(folder: Path, out: Path, *, shards: int = 1) -> Path:
    """The text corpus in ``folder`` as Parquet files in ``out`` (``<split>.parquet``, or shards)."""
    out.mkdir()
    for split in SPLITS:
        table = pa.Table.from_pylist(pairs(folder, split))
        if shards == 1:
            pq.write_table(table, out / f"{split}.parquet", row_group_size=64)  # several record batches
            continue
        step = -(-len(table) // shards)
        for i in range(shards):
            pq.write_table(table.slice(i * step, step), out / f"{split}-{i:05d}-of-{shards:05d}.parquet")
    return out


def saved(folder: Path, out: Path, *, names: dict[str, str] | None = None) -> Path:
    """The text corpus in ``folder`` as a ``DatasetDict.save_to_disk`` folder (splits renamed by ``names``)."""
    names = names or {}
    splits = {names.get(s, s): datasets.Dataset.from_list(pairs(folder, s)) for s in SPLITS}
    datasets.DatasetDict(splits).save_to_disk(str(out))
    return out


def records(path: Path, fmt: str, **changes) -> DataSection:
    return section(path, format=fmt, columns=COLUMNS, src_lang=None, tgt_lang=None, **changes)


def hub_records(**changes) -> DataSection:
    return DataSection(**{**records(Path("."), "datasets").model_dump(), "path": None, **changes})


def same_store(got, plain) -> None:
    assert got.vocab.to_json() == plain.vocab.to_json()
    for name in SPLITS:
        assert got.splits[name].src.tolist() == plain.splits[name].src.tolist()
        assert got.splits[name].tgt.tolist() == plain.splits[name].tgt.tolist()
    assert got.raw["val"] == plain.raw["val"]


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    folder = corpus(tmp_path_factory.mktemp("text") / "data", gz=False)
    return folder, prepare(section(folder))


@pytest.mark.parametrize("shards", [1, 3])
def test_parquet_gives_the_same_store_as_text_files(tmp_path, text_corpus, shards):
    folder, plain = text_corpus
    got = prepare(records(parquet(folder, tmp_path / "pq", shards=shards), "parquet"))
    same_store(got, plain)


def test_a_saved_dataset_gives_the_same_store_as_text_files(tmp_path, text_corpus):
    folder, plain = text_corpus
    out = saved(folder, tmp_path / "hf", names={"val": "validation"})
    same_store(prepare(records(out, "datasets", splits={"val": "validation"})), plain)


def test_a_flattened_dataset_is_read_by_its_dotted_column_names(tmp_path, text_corpus):
    folder, plain = text_corpus
    splits = {s: datasets.Dataset.from_list(pairs(folder, s)).flatten() for s in SPLITS}  # columns 'translation.de', ...
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "flat"))
    assert "translation.de" in splits["train"].column_names
    same_store(prepare(records(tmp_path / "flat", "datasets")), plain)


def test_a_hub_dataset_is_loaded_by_name_config_and_revision(tmp_path, text_corpus, monkeypatch):
    folder, plain = text_corpus
    out = saved(folder, tmp_path / "hub-cache")
    calls = []

    def load_dataset(name, config=None, *, revision=None):  # the Hub, stood in for: a cached DatasetDict
        calls.append((name, config, revision))
        return datasets.load_from_disk(str(out))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data = hub_records(hub={"name": "wmt/wmt14", "config": "de-en", "revision": "abc123"}, cache=str(tmp_path / "stores"))
    said: list[str] = []
    same_store(prepare(data, say=said.append), plain)
    assert calls == [("wmt/wmt14", "de-en", "abc123")]
    assert said[0].startswith("data: loading wmt/wmt14 de-en @abc123 with datasets.load_dataset")


def test_parquet_is_prepared_again_when_a_file_changes_and_never_otherwise(tmp_path, text_corpus, monkeypatch, said):
    out = parquet(text_corpus[0], tmp_path / "pq")
    first = prepare(records(out, "parquet"), say=said.append)
    real = arrow.batch_rows
    monkeypatch.setattr(arrow, "batch_rows", lambda *a, **k: pytest.fail("rows were read although a store matched"))
    again = prepare(records(out, "parquet", max_tokens=999), say=said.append)
    assert again.store == first.store and "using the prepared store" in said[-1]
    monkeypatch.setattr(arrow, "batch_rows", real)
    train = out / "train.parquet"
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 10**9))
    changed = prepare(records(out, "parquet"), say=said.append)
    assert changed.store != first.store and "train.parquet changed" in last(said)


def test_a_saved_dataset_is_prepared_again_when_it_is_saved_again_and_never_otherwise(tmp_path, text_corpus, monkeypatch, said):
    out = saved(text_corpus[0], tmp_path / "hf")
    first = prepare(records(out, "datasets"), say=said.append)
    real = arrow.batch_rows
    monkeypatch.setattr(arrow, "batch_rows", lambda *a, **k: pytest.fail("rows were read although a store matched"))
    assert prepare(records(out, "datasets"), say=said.append).store == first.store and "using the prepared store" in said[-1]
    monkeypatch.setattr(arrow, "batch_rows", real)
    other = saved(corpus(tmp_path / "other", gz=False, seed=3), tmp_path / "hf-new")
    (out / "train").rename(tmp_path / "old-train")
    (other / "train").rename(out / "train")  # the training split replaced by other data, same path
    changed = prepare(records(out, "datasets"), say=said.append)
    assert changed.store != first.store and "(train/data-00000-of-00001.arrow changed)" in last(said)
    assert changed.splits["train"].src.tolist() != first.splits["train"].src.tolist()


def test_a_hub_dataset_is_prepared_again_for_another_revision_and_never_otherwise(tmp_path, text_corpus, monkeypatch, said):
    out = saved(text_corpus[0], tmp_path / "hub-cache")
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, *, revision=None: datasets.load_from_disk(str(out)))
    hub = {"name": "wmt/wmt14", "config": "de-en"}
    data = hub_records(hub=hub, cache=str(tmp_path / "stores"))
    first = prepare(data, say=said.append)
    assert prepare(data, say=said.append).store == first.store and "using the prepared store" in said[-1]
    pinned = prepare(hub_records(hub={**hub, "revision": "v2"}, cache=str(tmp_path / "stores")), say=said.append)
    assert pinned.store != first.store and "data.hub changed" in last(said)


def test_stores_of_text_files_keep_their_key():
    """Fields added for datasets enter the key only when set: stores prepared before them are reused."""
    material = store.key_material(section(Path("x")), {}, "train")
    assert "hub" not in material["data"] and "fingerprints" not in material


def test_a_datasets_fingerprint_is_part_of_the_key(tmp_path):
    def sources(fingerprint: str) -> dict:
        return {"train": readers.SplitSource("train", (), iter, paired=True, fingerprint=fingerprint)}

    data = hub_records(hub={"name": "wmt/wmt14"})
    keys = {store.key_of(store.key_material(data, sources(f), "train")) for f in ("a1", "a1", "b2")}
    assert len(keys) == 2


def test_parquet_is_read_a_row_group_at_a_time(tmp_path):
    """Arrow's memory while the first row is read is a row group's, not the file's (pyarrow's
    pre-buffering would read the whole file ahead)."""
    rng = np.random.default_rng(0)
    words = [rng.bytes(24).hex() for _ in range(2000)]  # incompressible text
    table = pa.Table.from_pylist([{"translation": {"de": w, "en": w[::-1]}} for w in words])
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(table, folder / "train.parquet", row_group_size=100, compression="none")
    size = (folder / "train.parquet").stat().st_size
    before = pa.total_allocated_bytes()
    rows = arrow.parquet_rows([folder / "train.parquet"], tuple(COLUMNS.values()))
    assert next(rows)[0] == words[0]
    held = pa.total_allocated_bytes() - before
    assert held < size / 4, f"{held:,} bytes held for a {size:,}-byte file"
    assert sum(1 for _ in rows) == len(words) - 1


def write_parquet(folder: Path, rows: list[dict] | pa.Table) -> None:
    folder.mkdir()
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows)
    for split in ("train", "val"):
        pq.write_table(table, folder / f"{split}.parquet", row_group_size=2)


GOOD = [{"translation": {"de": "a b", "en": "b a"}}] * 3


@pytest.mark.parametrize(
    "rows,message",
    [
        ([{"translation": {"de": "a"}}], r"train\.parquet: no field 'translation\.en' \(data\.columns\): no 'en' in 'translation'; it has 'de'"),
        ([{"text": "a"}], r"train\.parquet: no field 'translation\.de' \(data\.columns\): no 'translation'; it has 'text'"),
        ([{"translation": "a b"}], r"no field 'translation\.de' \(data\.columns\): no 'de' in 'translation' \(string\)"),
        ([{"translation": {"de": "a", "en": 7}}], r"train\.parquet: field 'translation\.en' is int64, not text"),
        ([{"translation": {"de": ["a"], "en": "b"}}], r"train\.parquet: field 'translation\.de' is a list, not text"),
        (GOOD + [{"translation": {"de": "a", "en": None}}], r"train\.parquet, row 4: field 'translation\.en' is null, not text"),
        (GOOD + [{"translation": None}], r"train\.parquet, row 4: field 'translation\.de' is null, not text"),
    ],
)
def test_bad_parquet_records_are_named_by_file_and_row(tmp_path, monkeypatch, rows, message):
    monkeypatch.setattr(arrow, "BATCH", 2)  # the row is counted across record batches
    write_parquet(tmp_path / "pq", rows)
    with pytest.raises(DataError, match=message):
        prepare(records(tmp_path / "pq", "parquet"))


def test_a_null_record_is_null_whatever_its_fields_hold(tmp_path):
    """Arrow keeps the fields of a null record (a writer may leave text there): the record's null wins."""
    de, en = pa.array(["a b", "a b", "c d"]), pa.array(["b a", "b a", "d c"])
    translation = pa.StructArray.from_arrays([de, en], names=["de", "en"], mask=pa.array([False, False, True]))
    split = datasets.Dataset(datasets.table.InMemoryTable(pa.table({"translation": translation})))
    datasets.DatasetDict({"train": split, "val": split}).save_to_disk(str(tmp_path / "hf"))  # Arrow files keep the fields
    with pytest.raises(DataError, match=r"hf/train, row 3: field 'translation\.de' is null, not text"):
        prepare(records(tmp_path / "hf", "datasets"))


@pytest.mark.parametrize("damage", ["not parquet", "truncated", "damaged page"])
def test_a_damaged_parquet_file_is_named(tmp_path, damage):
    rows = [{"translation": {"de": f"ein satz {i} " * 20, "en": f"a sentence {i} " * 20}} for i in range(200)]
    write_parquet(tmp_path / "pq", rows)
    path = tmp_path / "pq" / "train.parquet"
    body = path.read_bytes()
    if damage == "not parquet":
        path.write_bytes(b"de,en\na,b\n")
    elif damage == "truncated":
        path.write_bytes(body[: len(body) // 2])
    else:  # the footer intact, a page in the middle overwritten
        middle = len(body) // 2
        path.write_bytes(body[:middle] + b"\xff" * 64 + body[middle + 64 :])
    with pytest.raises(DataError, match=r"cannot read .*train\.parquet: (not a readable Parquet file|damaged at row)"):
        prepare(records(tmp_path / "pq", "parquet"))


def test_missing_parquet_and_dataset_splits_are_named(tmp_path, text_corpus):
    folder = text_corpus[0]
    out = parquet(folder, tmp_path / "pq")
    (out / "val.parquet").unlink()
    with pytest.raises(DataError, match=r"missing data file: .*val\.parquet \(or shards val-\*\.parquet\)"):
        prepare(records(out, "parquet"))
    hf = saved(folder, tmp_path / "hf", names={"val": "validation"})
    with pytest.raises(DataError, match=r"no split 'val' in .*hf \(data\.splits\.val\); it has 'test', 'train', 'validation'"):
        prepare(records(hf, "datasets"))
    datasets.Dataset.from_list(pairs(folder, "train")).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(DataError, match=r"holds one dataset \(Dataset\.save_to_disk\), not splits"):
        prepare(records(tmp_path / "one", "datasets"))


def test_a_hub_dataset_without_the_split_or_that_cannot_load_is_named(tmp_path, text_corpus, monkeypatch):
    out = saved(text_corpus[0], tmp_path / "hub-cache")
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, *, revision=None: datasets.load_from_disk(str(out)))
    data = hub_records(hub={"name": "wmt/wmt14", "config": "de-en"}, splits={"val": "validation"}, cache=str(tmp_path / "s"))
    with pytest.raises(DataError, match=r"no split 'validation' in the dataset 'wmt/wmt14 de-en' \(data\.splits\.val\); it has 'train', 'val', 'test'"):
        prepare(data)

    def offline(name, config=None, *, revision=None):
        raise ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"cannot load the dataset 'wmt/wmt14 de-en' \(data\.hub\): Couldn't reach"):
        prepare(data)


def test_a_damaged_saved_dataset_is_named_with_its_split(tmp_path, text_corpus):
    out = saved(text_corpus[0], tmp_path / "hf")
    (arrow_file,) = (out / "train").glob("*.arrow")
    arrow_file.write_bytes(arrow_file.read_bytes()[:100])
    with pytest.raises(DataError, match=r"cannot read .*hf/train"):
        prepare(records(out, "datasets"))


@pytest.mark.parametrize("fmt,package", [("datasets", "datasets"), ("parquet", "pyarrow")])
def test_a_missing_package_names_the_extra(monkeypatch, tmp_path, fmt, package):
    import importlib

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: (_ for _ in ()).throw(ImportError(name)) if name == package else real(name, *a))
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match=rf"data\.format {fmt} needs the '{package}' package: pip install 'tfbuilder\[data\]'"):
        prepare(records(tmp_path / "data", fmt))


def test_bad_data_on_the_command_line_exits_2_naming_file_and_row(tmp_path, capsys):
    write_parquet(tmp_path / "pq", GOOD + [{"translation": {"de": "a", "en": None}}])
    sets = sum((["--set", o] for o in [
        "data.type=parallel", f"data.path={tmp_path / 'pq'}", "data.format=parquet", "data.columns={source: translation.de, target: translation.en}",
        "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280",
    ]), [])
    assert main(["prepare", str(QUICKSTART), *sets]) == 2
    err = capsys.readouterr().err
    assert "train.parquet, row 4: field 'translation.en' is null, not text" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "data,path,message",
    [
        ({"format": "datasets", "path": None}, "data.path", "needs a path (a save_to_disk folder) or hub"),
        ({"format": "datasets", "hub": {"name": "wmt/wmt14"}}, "data.hub", "set path (a save_to_disk folder) or hub"),
        ({"format": "parquet", "path": None, "hub": {"name": "wmt/wmt14"}}, "data.hub", "set format to datasets"),
        ({"format": "datasets", "path": None, "hub": {"name": "wmt wmt14"}}, "data.hub.name", "should match pattern"),
        ({"format": "datasets", "path": None, "hub": {"name": "x", "split": "train"}}, "data.hub.split", "unknown key 'split'"),
        ({"format": "parquet", "columns": {"source": "translation.de"}}, "data.columns.target", "needs columns.target"),
    ],
)
def test_the_recipe_names_bad_format_keys_by_dotted_path(tmp_path, capsys, data, path, message):
    import yaml

    fields = {"type": "parallel", "path": "corpus", "columns": COLUMNS, "tokenizer": {"type": "bpe", "vocab_size": 300}, **data}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"extends": str(QUICKSTART), "data": fields}), encoding="utf-8")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:" in err and f"{path}: " in err and message in err, err
