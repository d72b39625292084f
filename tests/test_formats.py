"""JSON Lines and CSV/TSV data (tfbuilder/data/formats.py): the same store as the equivalent text files,
and every malformed record named by file and line, before anything trains."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from conftest import QUICKSTART
from test_store import corpus, section
from tfbuilder.cli.commands import main
from tfbuilder.data import text
from tfbuilder.data.prepare import prepare
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection


def records(folder: Path, out: Path, fmt: str, *, gz: bool = False) -> Path:
    """The text corpus in ``folder`` rewritten as ``fmt`` records in ``out`` (nested JSON, quoted CSV)."""
    out.mkdir()
    for split in ("train", "val", "test"):
        de, en = text.read_lines(folder / f"{split}.de"), text.read_lines(folder / f"{split}.en")
        name = out / (f"{split}.{fmt}" + (".gz" if gz else ""))
        opener = gzip.open if gz else open
        with opener(name, "wt", encoding="utf-8", newline="") as f:
            if fmt == "jsonl":
                for s, t in zip(de, en):
                    f.write(json.dumps({"id": 1, "translation": {"de": s, "en": t}}) + "\n")
            else:
                writer = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",")
                writer.writerow(["id", "de", "en"])
                writer.writerows([i, s, t] for i, (s, t) in enumerate(zip(de, en)))
    return out


def record_section(folder: Path, fmt: str) -> DataSection:
    columns = {"source": "translation.de", "target": "translation.en"} if fmt == "jsonl" else {"source": "de", "target": "en"}
    return section(folder, format=fmt, columns=columns, src_lang=None, tgt_lang=None)


@pytest.mark.parametrize("fmt,gz", [("jsonl", False), ("jsonl", True), ("csv", False), ("tsv", True)])
def test_records_give_the_same_store_as_text_files(tmp_path, fmt, gz):
    folder = corpus(tmp_path / "text", gz=False)
    plain = prepare(section(folder))
    got = prepare(record_section(records(folder, tmp_path / fmt, fmt, gz=gz), fmt))
    assert got.vocab.to_json() == plain.vocab.to_json()
    for name in ("train", "val", "test"):
        assert got.splits[name].src.tolist() == plain.splits[name].src.tolist()
        assert got.splits[name].tgt.tolist() == plain.splits[name].tgt.tolist()
    assert got.raw["val"] == plain.raw["val"]


def test_a_monolingual_text_field(tmp_path):
    folder = tmp_path / "lm"
    folder.mkdir()
    for split in ("train", "val"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": f"a cat sat on mat {i}"}) + "\n" for i in range(50)))
    data = DataSection(type="monolingual", path=str(folder), format="jsonl", columns={"text": "text"}, tokenizer={"type": "char", "vocab_size": 20})
    prepared = prepare(data)
    assert len(prepared.splits["train"]) == 50 and prepared.splits["train"].tgt is None


@pytest.mark.parametrize(
    "fmt,content,message",
    [
        ("jsonl", '{"translation": {"de": "a", "en": "b"}}\n{"translation": {"de": "a"}}\n', r"train\.jsonl:2: no field 'translation\.en'"),
        ("jsonl", '{"translation": {"de": "a", "en": 7}}\n', r"train\.jsonl:1: field 'translation\.en' is int, not text"),
        ("jsonl", '{"translation": {"de": null, "en": "b"}}\n', r"train\.jsonl:1: field 'translation\.de' is null, not text"),
        ("jsonl", '{"translation": {"de": "a", "en": "b"}}\n{"translation": \n', r"train\.jsonl:2: not a JSON record"),
        ("jsonl", '["a", "b"]\n', r"train\.jsonl:1: a JSON record is an object"),
        ("jsonl", "[" * 100_000 + "]" * 100_000 + "\n", r"train\.jsonl:1: (the JSON record is nested too deeply|not a JSON record)"),
        ("csv", "id,de,en\n1,a,b\n2,a\n", r"train\.csv:3: 2 cells, but the header has 3"),
        ("csv", "id,de\n1,a\n", r"train\.csv:1: no column 'en' in the header"),
        ("csv", 'id,de,en\n1,"a"x,b\n', r"train\.csv:2: not a well-formed CSV row"),
    ],
)
def test_malformed_records_are_named_by_file_and_line(tmp_path, fmt, content, message):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / f"train.{fmt}").write_text(content, encoding="utf-8")
    (folder / f"val.{fmt}").write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        prepare(record_section(folder, fmt))


def test_columns_are_checked_by_the_schema():
    with pytest.raises(Exception, match="needs columns.target"):
        DataSection(type="parallel", path="x", format="csv", columns={"source": "de"}, tokenizer={"type": "bpe", "vocab_size": 300})
    with pytest.raises(Exception, match="set format to jsonl, csv, tsv, parquet or datasets"):
        DataSection(type="parallel", path="x", src_lang="de", tgt_lang="en", columns={"source": "de"}, tokenizer={"type": "bpe", "vocab_size": 300})


def test_prepare_on_the_command_line_names_the_bad_record(tmp_path, capsys):
    folder = records(corpus(tmp_path / "text", gz=False), tmp_path / "jsonl", "jsonl")
    with open(folder / "train.jsonl", "a", encoding="utf-8") as f:
        f.write('{"translation": {"de": "kaputt"}}\n')
    sets = sum((["--set", o] for o in [
        "data.type=parallel", f"data.path={folder}", "data.format=jsonl", "data.columns={source: translation.de, target: translation.en}",
        "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280",
    ]), [])
    assert main(["prepare", str(QUICKSTART), *sets]) == 2
    err = capsys.readouterr().err
    assert "train.jsonl:401: no field 'translation.en'" in err and "Traceback" not in err


def test_reading_tables_raises_the_csv_field_limit_only_while_any_is_read(tmp_path):
    """A cell longer than the csv module's default limit reads; the process-wide limit is the caller's
    again once every table being read (two at once, interleaved) is done."""
    import csv

    from tfbuilder.data.formats import MAX_FIELD, table_rows

    long = "x" * 200_000  # over csv's default limit of 131,072
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text(f"src,tgt\n{long},y\nz,w\n")
    caller = csv.field_size_limit()
    a = table_rows(tmp_path / "a.csv", ("src", "tgt"), delimiter=",")
    b = table_rows(tmp_path / "b.csv", ("src", "tgt"), delimiter=",")
    assert next(a) == (long, "y") and next(b) == (long, "y")
    assert list(a) == [("z", "w")]
    assert csv.field_size_limit() == MAX_FIELD  # b is still being read
    assert list(b) == [("z", "w")]
    assert csv.field_size_limit() == caller
