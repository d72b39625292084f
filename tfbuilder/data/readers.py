"""Where a split's examples come from: a stream of (source, target) text rows, and the files behind it.

Every format reads through here and nothing holds a whole split: rows are yielded one at a time and
consumed in chunks (:func:`chunks`), so reading costs bounded memory whatever the corpus size. The
files of a split are listed so that the prepared store (:mod:`tfbuilder.data.store`) can tell whether
they changed.

Formats register their readers by name, as components do (:func:`register_format`, :func:`add_format`);
the registration also declares the format's traits to the schema (:mod:`tfbuilder.spec.formats`).
tfbuilder's own formats (:mod:`tfbuilder.data.builtin`) register the same way a plugin's do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Protocol, TypeVar

from tfbuilder.data import synthetic, text
from tfbuilder.errors import DataError
from tfbuilder.spec import formats
from tfbuilder.spec.formats import FormatTraits
from tfbuilder.spec.sections import DataSection

# (source or text, target or None); labelled data adds the label: (text, pair or None, label)
Row = tuple[str, str | None] | tuple[str, str | None, str]
Say = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True)
class SplitSource:
    """One split: its files (empty for generated data) and a function streaming its rows."""

    name: str
    files: tuple[Path, ...]
    rows: Callable[[], Iterator[Row]]
    paired: bool  # rows have targets (translation) or second texts (labelled pairs)
    label: str | None = None  # how errors name the split when its files are not one per side (records, datasets)
    fingerprint: str | None = None  # what identifies a loaded Hugging Face dataset, beside its files
    labelled: bool = False  # rows end with a label (data.type labelled, tfbuilder.data.labels)


class FileRows(Protocol):
    """One file's rows: the values of ``fields`` in each record, in order. ``fields`` are the names in
    ``data.columns`` (formats with columns), else the roles ``("source", "target")`` or ``("text",)``.
    ``numbers`` are the fields that may hold numbers (a label), given as their JSON text."""

    def __call__(
        self, path: Path, fields: tuple[str, ...], *, numbers: tuple[str, ...] = ()
    ) -> Iterator[tuple[str, ...]]: ...


SplitsReader = Callable[[DataSection, dict[str, str], Say], dict[str, SplitSource]]
"""A format's splits: ``(data, stems, say)`` -> the splits that exist (``test`` is optional), each
checked for existence now and read only when its rows are asked for."""


@dataclass(frozen=True)
class Reader:
    """A registered format: its traits, how its splits are found, and (for formats whose split is one
    file) how one file is read, which ``predict`` also uses for input files."""

    traits: FormatTraits
    splits: SplitsReader
    rows: FileRows | None = None


_readers: dict[str, Reader] = {}


def add_format(traits: FormatTraits, splits: SplitsReader, rows: FileRows | None = None) -> None:
    """Register a format that finds its own splits (per-language files, shards, a dataset)."""
    formats.declare(traits)  # the schema's view; raises for a name already taken
    _readers[traits.name] = Reader(formats.get(traits.name), splits, rows)


def register_format(
    name: str, *, suffix: str, description: str, columns: bool = False
) -> Callable[[FileRows], FileRows]:
    """Decorator over a :class:`FileRows`: register the format ``name`` whose split is one file,
    ``<data.path>/<stem>.<suffix>`` or its ``.gz``. ``columns``: its records have named fields, which
    ``data.columns`` picks; else each row is the texts themselves (source and target, or a text)."""

    def decorate(rows: FileRows) -> FileRows:
        traits = FormatTraits(
            name, description, columns=columns, suffixes=(f".{suffix}",), source=getattr(rows, "__module__", "")
        )
        add_format(traits, lambda data, stems, say: file_splits(data, stems, suffix, rows), rows)
        return rows

    return decorate


def unregister_format(name: str) -> None:
    """Remove a registered format (for tests and interactive work)."""
    del _readers[name]
    formats.forget(name)


def reader(name: str) -> Reader:
    formats.load()
    return _readers[name]


def file_reader(path: Path) -> Reader | None:
    """The format that reads ``path`` by its suffix (``.gz`` aside), when that format reads single files."""
    formats.load()
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    return next((r for r in _readers.values() if r.rows is not None and last in r.traits.suffixes), None)


def file_suffixes(*, columns: bool) -> str:
    """The suffixes of the formats that read single files, for a message: ``.jsonl, .csv or .tsv``."""
    formats.load()
    found = [
        s for r in _readers.values() if r.rows is not None and r.traits.columns == columns for s in r.traits.suffixes
    ]
    return ", ".join(found[:-1]) + " or " + found[-1] if len(found) > 1 else "".join(found)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


SPLITS = ("train", "val", "test")


def split_sources(data: DataSection, *, say: Say | None = None) -> dict[str, SplitSource]:
    """The splits of ``data`` that exist (``test`` is optional), each checked for existence now and
    read only when its rows are asked for. ``say`` hears what takes time before any row is read (a
    dataset loaded from the Hub)."""
    if data.type == "synthetic":
        return {name: _synthetic(data, name, i) for i, name in enumerate(SPLITS)}
    stems = {"train": data.splits.train, "val": data.splits.val, "test": data.splits.test}
    return reader(data.format).splits(data, stems, say or (lambda line: None))


def _synthetic(data: DataSection, name: str, index: int) -> SplitSource:
    size = {"train": data.train_size, "val": data.val_size, "test": data.test_size}[name]
    task = data.task
    if task is None:  # the schema requires it; a section built without validation gets this
        raise DataError("synthetic data needs data.task")

    def rows() -> Iterator[Row]:
        src, tgt = synthetic.generate(task, n=size, symbols=data.symbols, lengths=data.lengths, seed=data.seed + index)
        return zip(src, tgt, strict=True)

    return SplitSource(name, (), rows, paired=True)


def file_splits(data: DataSection, stems: dict[str, str], suffix: str, read: FileRows) -> dict[str, SplitSource]:
    """Splits of one file each, ``<data.path>/<stem>.<suffix>[.gz]``, read by ``read``."""
    directory = Path(data.path or ".")
    fields, paired, labelled = fields_of(data), is_paired(data), data.type == "labelled"
    numbers = numbers_of(data, fields)
    out: dict[str, SplitSource] = {}
    for name, stem in stems.items():
        if name == "test" and not text.exists(directory, stem, suffix):
            continue  # a test split is optional for training
        path = text.find(directory, stem, suffix)

        def rows(path: Path = path) -> Iterator[tuple[str, ...]]:
            return read(path, fields, numbers=numbers)

        out[name] = SplitSource(
            name, (path,), as_rows(rows, paired, labelled), paired=paired, label=str(path), labelled=labelled
        )
    return out


def fields_of(data: DataSection) -> tuple[str, ...]:
    """The record fields ``data.columns`` names: (source, target), (text,), or labelled data's
    (text, [text_pair,] label); for a format without columns, the roles (source, target) or (text,)."""
    if not formats.get(data.format).columns:
        return ("source", "target") if data.type == "parallel" else ("text",)
    columns = data.columns
    if columns is None:  # the schema requires them; a section built without validation gets this
        raise DataError(f"data.format {data.format} needs data.columns")
    if data.type == "labelled":
        return (columns.text or "",) + ((columns.text_pair,) if columns.text_pair else ()) + (columns.label or "",)
    return (columns.source or "", columns.target or "") if data.type == "parallel" else (columns.text or "",)


def is_paired(data: DataSection) -> bool:
    """Whether rows have a second text: a translation's target, or a labelled pair."""
    return data.type == "parallel" or (
        data.type == "labelled" and data.columns is not None and data.columns.text_pair is not None
    )


def numbers_of(data: DataSection, fields: tuple[str, ...]) -> tuple[str, ...]:
    """The fields that may hold numbers rather than text: a label (given as its JSON text)."""
    return fields[-1:] if data.type == "labelled" else ()


def label_of(row: Row) -> str:
    """The label of a labelled row, ``(text, pair or None, label)``."""
    if len(row) != 3:  # a reader of labelled data yields 3-tuples (as_rows with labelled=True)
        raise DataError(f"a labelled row has a label as its third value, not {row!r:.80}")
    return row[2]


def as_rows(
    read: Callable[[], Iterator[tuple[str, ...]]], paired: bool, labelled: bool = False
) -> Callable[[], Iterator[Row]]:
    """Rows of a split from the field values ``read`` yields."""

    def rows() -> Iterator[Row]:
        for values in read():
            if labelled:  # (text, pair or None, label)
                yield (values[0], values[1] if paired else None, values[-1])
            else:
                yield (values[0], values[1]) if paired else (values[0], None)

    return rows
