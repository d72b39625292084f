"""The record formats ``jsonl``, ``csv`` and ``tsv``: a split is ``<stem>.<format>[.gz]``, its records'
fields named by ``data.columns`` (the readers are :mod:`tfbuilder.data.formats`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tfbuilder.data.formats import jsonl_rows, table_rows
from tfbuilder.data.readers import register_format

register_format(
    "jsonl",
    suffix="jsonl",
    columns=True,
    description="<stem>.jsonl[.gz]: a JSON object per line, fields by dotted path",
)(jsonl_rows)


@register_format("csv", suffix="csv", columns=True, description="<stem>.csv[.gz] with a header row, fields by name")
def csv_rows(path: Path, fields: tuple[str, ...], *, numbers: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The ``fields`` of each row of a CSV file (every cell is text, a label included)."""
    return table_rows(path, fields, delimiter=",")


@register_format("tsv", suffix="tsv", columns=True, description="<stem>.tsv[.gz] with a header row, fields by name")
def tsv_rows(path: Path, fields: tuple[str, ...], *, numbers: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The ``fields`` of each row of a TSV file (every cell is text, a label included)."""
    return table_rows(path, fields, delimiter="\t")
