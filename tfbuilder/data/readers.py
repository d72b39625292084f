"""Where a split's examples come from: a stream of (source, target) text rows, and the files behind it.

Every format reads through here and nothing holds a whole split: rows are yielded one at a time and
consumed in chunks (:func:`chunks`), so reading costs bounded memory whatever the corpus size. The
files of a split are listed so that the prepared store (:mod:`tfbuilder.data.store`) can tell whether
they changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TypeVar

from tfbuilder.data import arrow, formats, synthetic, text
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection

Row = tuple[
    str, "str | None"
]  # (source or text, target or None); labelled data adds the label: (text, pair or None, label)
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


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


SPLITS = ("train", "val", "test")


def split_sources(data: DataSection, *, say: Callable[[str], None] | None = None) -> dict[str, SplitSource]:
    """The splits of ``data`` that exist (``test`` is optional), each checked for existence now and
    read only when its rows are asked for. ``say`` hears what takes time before any row is read (a
    dataset loaded from the Hub)."""
    if data.type == "synthetic":
        return {name: _synthetic(data, name, i) for i, name in enumerate(SPLITS)}
    stems = {"train": data.splits.train, "val": data.splits.val, "test": data.splits.test}
    if data.format == "datasets":
        return _datasets(data, stems, say or (lambda line: None))
    directory = Path(data.path or ".")
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
        src, tgt = synthetic.generate(
            data.task, n=size, symbols=data.symbols, lengths=data.lengths, seed=data.seed + index
        )
        return zip(src, tgt)

    return SplitSource(name, (), rows, paired=True)


def _text(data: DataSection, name: str, paths: tuple[Path, ...]) -> SplitSource:
    if len(paths) == 2:
        return SplitSource(name, paths, lambda: text.parallel_lines(*paths), paired=True)
    read = text.paragraphs if data.documents == "paragraphs" else text.lines
    return SplitSource(name, paths, lambda: ((line, None) for line in read(paths[0])), paired=False)


def _fields(data: DataSection) -> tuple[str, ...]:
    """The record fields ``data.columns`` names: (source, target), (text,), or labelled data's
    (text, [text_pair,] label)."""
    columns = data.columns
    if columns is None:  # the schema requires them; a section built without validation gets this
        raise DataError(f"data.format {data.format} needs data.columns")
    if data.type == "labelled":
        return (columns.text or "",) + ((columns.text_pair,) if columns.text_pair else ()) + (columns.label or "",)
    return (columns.source or "", columns.target or "") if data.type == "parallel" else (columns.text or "",)


def _paired(data: DataSection) -> bool:
    """Whether rows have a second text: a translation's target, or a labelled pair."""
    return data.type == "parallel" or (
        data.type == "labelled" and data.columns is not None and data.columns.text_pair is not None
    )


def _numbers(data: DataSection, fields: tuple[str, ...]) -> tuple[str, ...]:
    """The fields that may hold numbers rather than text: a label (given as its JSON text)."""
    return fields[-1:] if data.type == "labelled" else ()


def _records(data: DataSection, directory: Path, stems: dict[str, str]) -> dict[str, SplitSource]:
    """Splits of JSON Lines, CSV, TSV (:mod:`tfbuilder.data.formats`) or Parquet files (:mod:`tfbuilder.data.arrow`)."""
    fields, paired, labelled = _fields(data), _paired(data), data.type == "labelled"
    numbers = _numbers(data, fields)
    if data.format == "parquet":
        arrow.require("pyarrow", "parquet")  # said now, not when the first row is read
    out: dict[str, SplitSource] = {}
    for name, stem in stems.items():
        if data.format == "parquet":
            if name == "test" and not arrow.parquet_exists(directory, stem):
                continue
            paths = tuple(arrow.parquet_files(directory, stem))
            read = partial(arrow.parquet_rows, list(paths), fields, numbers=numbers)
            label = str(paths[0]) if len(paths) == 1 else f"{directory}/{stem}-*.parquet"
            out[name] = SplitSource(
                name, paths, _as_rows(read, paired, labelled), paired=paired, label=label, labelled=labelled
            )
            continue
        if name == "test" and not formats.exists(directory, stem, data.format):
            continue
        path = formats.find(directory, stem, data.format)
        if data.format == "jsonl":
            read = partial(formats.jsonl_rows, path, fields, numbers=numbers)
        else:
            read = partial(formats.table_rows, path, fields, delimiter="\t" if data.format == "tsv" else ",")
        out[name] = SplitSource(
            name, (path,), _as_rows(read, paired, labelled), paired=paired, label=str(path), labelled=labelled
        )
    return out


def _datasets(data: DataSection, stems: dict[str, str], say: Callable[[str], None]) -> dict[str, SplitSource]:
    """Splits of a Hugging Face dataset: a ``save_to_disk`` folder (``data.path``) or a Hub dataset
    (``data.hub``, through ``load_dataset``). Loading maps the Arrow files; rows are read when asked for."""
    fields, paired, labelled = _fields(data), _paired(data), data.type == "labelled"
    keys = {"train": "data.splits.train", "val": "data.splits.val", "test": "data.splits.test"}
    hub = data.hub
    loaded = None
    if hub is not None:
        say(
            f"data: loading {arrow.hub_label(hub.name, hub.config, hub.revision)} with datasets.load_dataset (downloaded once into the Hugging Face cache)"
        )
        loaded = arrow.load_hub(hub.name, hub.config, hub.revision)
    out: dict[str, SplitSource] = {}
    for name, split in stems.items():
        if hub is not None:
            label = arrow.hub_label(hub.name, hub.config, hub.revision)
            if name == "test" and split not in loaded:
                continue
            dataset = arrow.hub_split(loaded, split, label, keys[name])
            where = f"the {split} split of {label}"
        else:
            folder = Path(data.path or ".")
            if name == "test" and not (folder / split).is_dir():
                continue
            dataset = arrow.load_saved(folder, split, keys[name])
            where = f"{folder / split}"
        read = arrow.dataset_rows(dataset, fields, where, numbers=_numbers(data, fields))
        out[name] = SplitSource(
            name,
            arrow.dataset_files(dataset),
            _as_rows(read, paired, labelled),
            paired=paired,
            label=where,
            fingerprint=getattr(dataset, "_fingerprint", None),  # datasets' own content hash (no public accessor)
            labelled=labelled,
        )
    return out


def _as_rows(
    read: Callable[[], Iterator[tuple[str, ...]]], paired: bool, labelled: bool = False
) -> Callable[[], Iterator[Row]]:
    def rows() -> Iterator[Row]:
        for values in read():
            if labelled:  # (text, pair or None, label)
                yield (values[0], values[1] if paired else None, values[-1])
            else:
                yield (values[0], values[1]) if paired else (values[0], None)

    return rows
