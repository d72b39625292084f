"""Where a split's examples come from: a stream of (source, target) text rows, and the files behind it.

Every format reads through here and nothing holds a whole split: rows are yielded one at a time and
consumed in chunks (:func:`chunks`), so reading costs bounded memory whatever the corpus size. The
files of a split are listed so that the prepared store (:mod:`tfbuilder.data.store`) can tell whether
they changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TypeVar

from ..sections import DataSection
from . import formats, synthetic, text
from .tokenizers import DataError

Row = tuple[str, "str | None"]  # (source or text, target or None); labelled data adds the label: (text, pair or None, label)
T = TypeVar("T")


@dataclass(frozen=True)
class SplitSource:
    """One split: its files (empty for generated data) and a function streaming its rows."""

    name: str
    files: tuple[Path, ...]
    rows: Callable[[], Iterator[Row]]
    paired: bool  # rows have targets (translation) or second texts (labelled pairs)
    labelled: bool = False  # rows end with a label (data.type labelled)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


SPLITS = ("train", "val", "test")


def split_sources(data: DataSection) -> dict[str, SplitSource]:
    """The splits of ``data`` that exist (``test`` is optional), each checked for existence now and
    read only when its rows are asked for."""
    if data.type == "synthetic":
        return {name: _synthetic(data, name, i) for i, name in enumerate(SPLITS)}
    directory = Path(data.path)
    stems = {"train": data.splits.train, "val": data.splits.val, "test": data.splits.test}
    if data.format != "text":
        return _records(data, directory, stems)
    langs = (data.src_lang, data.tgt_lang) if data.type == "parallel" else (data.lang,)
    out: dict[str, SplitSource] = {}
    for name, stem in stems.items():
        if name == "test" and not any(text.exists(directory, stem, lang) for lang in langs):
            continue  # a test split is optional for training
        paths = tuple(text.find(directory, stem, lang) for lang in langs)
        out[name] = _text(data, name, paths)
    return out


def _synthetic(data: DataSection, name: str, index: int) -> SplitSource:
    size = {"train": data.train_size, "val": data.val_size, "test": data.test_size}[name]

    def rows() -> Iterator[Row]:
        src, tgt = synthetic.generate(data.task, n=size, symbols=data.symbols, lengths=data.lengths, seed=data.seed + index)
        return zip(src, tgt)

    return SplitSource(name, (), rows, paired=True)


def _text(data: DataSection, name: str, paths: tuple[Path, ...]) -> SplitSource:
    if len(paths) == 2:
        return SplitSource(name, paths, lambda: text.parallel_lines(*paths), paired=True)
    read = text.paragraphs if data.documents == "paragraphs" else text.lines
    return SplitSource(name, paths, lambda: ((line, None) for line in read(paths[0])), paired=False)


def _records(data: DataSection, directory: Path, stems: dict[str, str]) -> dict[str, SplitSource]:
    """Splits of JSON Lines, CSV or TSV files (:mod:`tfbuilder.data.formats`)."""
    columns = data.columns
    if columns is None:  # the schema requires them; a section built without validation gets this
        raise DataError(f"data.format {data.format} needs data.columns")
    labelled = data.type == "labelled"
    paired = data.type == "parallel" or (labelled and columns.text_pair is not None)
    if labelled:
        fields = (columns.text or "",) + ((columns.text_pair,) if columns.text_pair else ()) + (columns.label or "",)
    else:
        fields = (columns.source or "", columns.target or "") if paired else (columns.text or "",)
    out: dict[str, SplitSource] = {}
    for name, stem in stems.items():
        if name == "test" and not formats.exists(directory, stem, data.format):
            continue
        path = formats.find(directory, stem, data.format)
        rows = _record_rows(data.format, path, fields, paired, labelled=labelled)
        out[name] = SplitSource(name, (path,), rows, paired=paired, labelled=labelled)
    return out


def _record_rows(fmt: str, path: Path, fields: tuple[str, ...], paired: bool, *, labelled: bool = False) -> Callable[[], Iterator[Row]]:
    numbers = fields[-1:] if labelled else ()

    def rows() -> Iterator[Row]:
        if fmt == "jsonl":
            read = formats.jsonl_rows(path, fields, numbers=numbers)
        else:
            read = formats.table_rows(path, fields, delimiter="\t" if fmt == "tsv" else ",")
        for values in read:
            if labelled:  # (text, pair or None, label)
                yield (values[0], values[1] if paired else None, values[-1])
            else:
                yield (values[0], values[1]) if paired else (values[0], None)

    return rows
