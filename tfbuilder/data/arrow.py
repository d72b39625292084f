"""Columnar records: Parquet files and Hugging Face ``datasets``, streamed in Arrow record batches.

Both formats are Arrow underneath, so one reader serves them: record batches of at most ``BATCH`` rows
are read one after another (never the whole table), the fields ``data.columns`` names (dotted paths
into nested records, ``translation.de``) are taken out of each batch with Arrow's own kernels, and only
those strings become Python objects. A field is checked against the schema before any row is read (a
missing field, a number or a list where text belongs); a null value is named by its row. Errors name
the file (Parquet) or the split and dataset (``datasets``) and the row, counted from 1.

``pyarrow`` and ``datasets`` are optional: ``pip install 'tfbuilder[data]'``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tfbuilder.data import text
from tfbuilder.errors import DataError

BATCH = 8192  # rows per record batch: bounded memory, and the size prepare() encodes at once
EXTRA = "pip install 'tfbuilder[data]'"


def require(module: str, fmt: str) -> Any:
    """Import ``module`` (pyarrow, datasets), or a :class:`DataError` that says how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"data.format {fmt} needs the '{module}' package: {EXTRA}") from None


# --- fields of an Arrow schema -------------------------------------------------------------------


def split_path(names: list[str], dotted: str) -> list[str]:
    """The parts of a dotted field: a top-level column whose name has dots (a flattened dataset's
    ``translation.de``) is one part; otherwise each dot goes one record deeper."""
    return [dotted] if dotted in names else dotted.split(".")


def columns_of(schema: Any, fields: tuple[str, ...]) -> list[str]:
    """The top-level columns that hold ``fields`` (the only ones read)."""
    return list(dict.fromkeys(split_path(schema.names, f)[0] for f in fields))


def check_fields(schema: Any, fields: tuple[str, ...], where: str, *, numbers: tuple[str, ...] = ()) -> None:
    """Each dotted field of ``fields`` exists in ``schema`` and holds text (those in ``numbers``, a
    label, may hold numbers or booleans); a :class:`DataError` naming ``where`` (a file, a split) and
    what the schema has otherwise."""
    import pyarrow as pa

    for dotted in fields:
        node: Any = schema
        parts = split_path(schema.names, dotted)
        for depth, part in enumerate(parts):
            names = [f.name for f in node] if isinstance(node, (pa.Schema, pa.StructType)) else None
            if names is None or part not in names:
                parent = ".".join(parts[:depth])
                has = f"; it has {', '.join(map(repr, names[:20]))}" if names else ""
                inside = (
                    f" in '{parent}' ({_kind(node)})"
                    if parent and names is None
                    else (f" in '{parent}'" if parent else "")
                )
                raise DataError(f"{where}: no field '{dotted}' (data.columns): no '{part}'{inside}{has}")
            node = node.field(part).type
        if not _is_text(node) and not (dotted in numbers and _is_number(node)):
            raise DataError(f"{where}: field '{dotted}' is {_kind(node)}, not text (every row; data.columns)")


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    is_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow 16 and later
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_view(kind)


def _is_number(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _kind(kind: Any) -> str:
    import pyarrow as pa

    if isinstance(kind, pa.StructType):
        return "a record"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return "a list"
    return str(kind)


def _leaf(batch: Any, dotted: str) -> Any:
    """The Arrow array of field ``dotted`` in ``batch``, as plain strings (a null parent is a null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first, *rest = split_path(batch.schema.names, dotted)
    array = batch.column(first)
    for part in rest:
        array = pc.struct_field(array, part)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def batch_rows(
    batches: Iterable[Any], fields: tuple[str, ...], where: str, *, numbers: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """The ``fields`` of every row of ``batches`` (Arrow record batches whose schema
    :func:`check_fields` accepted); a null value is an error naming ``where`` and its row. Numbers
    (of the fields in ``numbers``) are given as their JSON text, as JSON Lines labels are."""
    start = 0
    for batch in batches:
        columns = []
        for dotted in fields:
            array = _leaf(batch, dotted)
            if array.null_count:
                row = start + array.is_null().to_pylist().index(True) + 1
                raise DataError(f"{where}, row {row:,}: field '{dotted}' is null, not text")
            values = array.to_pylist()
            if dotted in numbers and not _is_text(array.type):
                values = [json.dumps(v) for v in values]
            columns.append(values)
        yield from zip(*columns, strict=True)
        start += batch.num_rows


# --- Parquet ---------------------------------------------------------------------------------------


def parquet_files(directory: Path, stem: str) -> list[Path]:
    """``<directory>/<stem>.parquet``, or its shards ``<stem>-*.parquet`` in name order (the Hub's
    ``train-00000-of-00003.parquet``); a clear error when there is neither."""
    single = directory / f"{stem}.parquet"
    if single.exists() or single.is_symlink():
        text.check_regular(single)
        return [single]
    shards = sorted(directory.glob(f"{_escape(stem)}-*.parquet")) if directory.is_dir() else []
    if shards:
        for shard in shards:
            text.check_regular(shard)
        return shards
    if directory.exists() and not directory.is_dir():
        raise DataError(f"data.path {directory} is a file, not a directory")
    if not directory.is_dir():
        raise DataError(f"data directory {directory} does not exist (data.path)")
    raise DataError(f"missing data file: {single} (or shards {stem}-*.parquet) in {directory}")


def parquet_exists(directory: Path, stem: str) -> bool:
    single = directory / f"{stem}.parquet"
    return (
        single.exists()
        or single.is_symlink()
        or (directory.is_dir() and any(directory.glob(f"{_escape(stem)}-*.parquet")))
    )


def _escape(stem: str) -> str:
    # split stems hold no glob characters (the schema refuses them); escape anyway, glob's way
    return "".join(f"[{c}]" if c in "*?[]" else c for c in stem)


def parquet_rows(
    paths: list[Path], fields: tuple[str, ...], *, numbers: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """The ``fields`` of every row of the Parquet files ``paths``, in order, a record batch at a time;
    only the columns that hold them are read."""
    pa = require("pyarrow", "parquet")
    import pyarrow.parquet as pq

    for path in paths:
        try:
            # pyarrow's pre-buffering reads every requested row group ahead, the whole file: off, and
            # one row group asked for at a time, so memory is one row group's whatever the file's size
            parquet = pq.ParquetFile(path, pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read {path}: not a readable Parquet file ({_first_line(exc)})") from None
        with parquet:
            check_fields(parquet.schema_arrow, fields, str(path), numbers=numbers)
            top = columns_of(parquet.schema_arrow, fields)
            batches = (
                batch
                for group in range(parquet.metadata.num_row_groups)
                for batch in parquet.iter_batches(batch_size=BATCH, columns=top, row_groups=[group])
            )
            yield from batch_rows(_guarded(batches, str(path)), fields, str(path), numbers=numbers)


def _guarded(batches: Iterator[Any], where: str) -> Iterator[Any]:
    """``batches``, with a damaged page (or any read error) named by ``where`` and the first row
    of the batch that could not be read."""
    import pyarrow as pa

    start = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DataError(
                f"cannot read {where}: damaged at row {start + 1:,} or after ({_first_line(exc)})"
            ) from None
        start += batch.num_rows
        yield batch


# --- Hugging Face datasets ------------------------------------------------------------------------


def load_saved(path: Path, split: str, key: str) -> Any:
    """Split ``split`` of a folder written by ``DatasetDict.save_to_disk`` (or a folder holding one
    ``Dataset.save_to_disk`` folder per split): ``<path>/<split>/``. ``key`` is the recipe key that
    names the split (``data.splits.val``)."""
    datasets = require("datasets", "datasets")
    if not path.is_dir():
        raise DataError(
            f"data directory {path} does not exist (data.path)"
            if not path.exists()
            else f"data.path {path} is a file, not a directory"
        )
    folder = path / split
    if not folder.is_dir():
        if (path / "state.json").is_file():
            raise DataError(
                f"{path} holds one dataset (Dataset.save_to_disk), not splits: save a DatasetDict, or put each split's "
                f"folder at {path}/<split> ({key} is '{split}')"
            )
        has = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise DataError(
            f"no split '{split}' in {path} ({key}); it has {', '.join(map(repr, has)) or 'no saved splits'}"
        )
    try:
        return datasets.load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 (datasets and pyarrow raise many kinds for a damaged folder)
        raise DataError(f"cannot read the {split} split in {folder}: {_first_line(exc)}") from None


def load_hub(name: str, config: str | None, revision: str | None) -> Any:
    """Every split of a Hub dataset, through ``datasets.load_dataset`` (downloaded once into the
    ``datasets`` cache, ``$HF_HOME``, and read from there afterwards)."""
    datasets = require("datasets", "datasets")
    try:
        loaded = datasets.load_dataset(name, config, revision=revision)
    except Exception as exc:  # noqa: BLE001 (network, missing dataset or config: all reported the same way)
        raise DataError(
            f"cannot load the dataset '{hub_label(name, config, revision)}' (data.hub): {_first_line(exc)}"
        ) from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise DataError(f"the dataset '{hub_label(name, config, revision)}' has no splits (data.hub)")
    return loaded


def hub_label(name: str, config: str | None, revision: str | None) -> str:
    return name + (f" {config}" if config else "") + (f" @{revision}" if revision else "")


def hub_split(loaded: Any, split: str, label: str, key: str) -> Any:
    if split not in loaded:
        raise DataError(f"no split '{split}' in the dataset '{label}' ({key}); it has {', '.join(map(repr, loaded))}")
    return loaded[split]


def dataset_files(dataset: Any) -> tuple[Path, ...]:
    """The Arrow files a loaded split reads (what identifies it in the store's key)."""
    return tuple(Path(f["filename"]) for f in dataset.cache_files)


def dataset_rows(
    dataset: Any, fields: tuple[str, ...], where: str, *, numbers: tuple[str, ...] = ()
) -> Callable[[], Iterator[tuple[str, ...]]]:
    """A function streaming the ``fields`` of every row of ``dataset`` (a ``datasets.Dataset``), in
    Arrow batches of ``BATCH`` rows; the schema is checked now."""
    check_fields(dataset.features.arrow_schema, fields, where, numbers=numbers)
    top = columns_of(dataset.features.arrow_schema, fields)

    def rows() -> Iterator[tuple[str, ...]]:
        tables = dataset.select_columns(top).with_format("arrow").iter(batch_size=BATCH)
        batches = (batch for table in _guarded(tables, where) for batch in table.to_batches())
        yield from batch_rows(batches, fields, where, numbers=numbers)

    return rows


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
