"""The ``parquet`` format: a split is ``<stem>.parquet`` or its shards ``<stem>-*.parquet``, read by
Arrow a row group at a time (:mod:`tfbuilder.data.arrow`; needs the optional package pyarrow)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tfbuilder.data import arrow
from tfbuilder.data.readers import Say, SplitSource, add_format, as_rows, fields_of, is_paired, numbers_of
from tfbuilder.spec.formats import FormatTraits
from tfbuilder.spec.sections import DataSection


def parquet_splits(data: DataSection, stems: dict[str, str], say: Say) -> dict[str, SplitSource]:
    """A split per stem, its files listed now (in name order) and read when its rows are asked for."""
    arrow.require("pyarrow", "parquet")  # said now, not when the first row is read
    directory = Path(data.path or ".")
    fields, paired, labelled = fields_of(data), is_paired(data), data.type == "labelled"
    out: dict[str, SplitSource] = {}
    for name, stem in stems.items():
        if name == "test" and not arrow.parquet_exists(directory, stem):
            continue
        paths = tuple(arrow.parquet_files(directory, stem))
        read = partial(arrow.parquet_rows, list(paths), fields, numbers=numbers_of(data, fields))
        label = str(paths[0]) if len(paths) == 1 else f"{directory}/{stem}-*.parquet"
        out[name] = SplitSource(
            name, paths, as_rows(read, paired, labelled), paired=paired, label=label, labelled=labelled
        )
    return out


add_format(
    FormatTraits(
        "parquet",
        "<stem>.parquet or its shards <stem>-*.parquet, fields by dotted path into nested columns",
        columns=True,
        suffixes=(".parquet",),
        source=__name__,
    ),
    parquet_splits,
)
