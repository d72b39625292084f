"""Records instead of plain lines: JSON Lines and CSV/TSV files, streamed into (source, target) rows.

A split is ``<data.path>/<stem>.<ext>`` (``.jsonl``, ``.csv``, ``.tsv``, each optionally ``.gz``), and
``data.columns`` names the fields that hold the source and target (translation) or the text (language
models): dotted paths into JSON records (``translation.de``), header names in CSV/TSV files. Every
record is checked as it is read; a missing field, a value that is not text, a malformed record or a
row with the wrong number of cells is an error naming the file and the line or row. Reading goes
through :func:`tfbuilder.data.text.lines`, so the same bounds hold (16 MiB per line). The formats
themselves are registered by :mod:`tfbuilder.data.builtin.records`.
"""

from __future__ import annotations

import csv
import difflib
import json
from collections.abc import Iterator
from pathlib import Path

from tfbuilder.data import text
from tfbuilder.errors import ColumnError, DataError, did_you_mean

MAX_FIELD = 16 * 2**20  # a cell is text, at most as long as a line
MAX_NAMES = 200  # the field names of a record a "did you mean" looks through


def _field(record: object, dotted: str) -> object:
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def _names(record: dict, prefix: str = "") -> list[str]:
    """The dotted paths of ``record``'s fields, nested ones too (at most :data:`MAX_NAMES`)."""
    out: list[str] = []
    for key, value in record.items():
        if len(out) >= MAX_NAMES:
            break
        name = f"{prefix}{key}"
        out.append(name)
        if isinstance(value, dict):
            out += _names(value, f"{name}.")[: MAX_NAMES - len(out)]
    return out


def _text_of(value: object, where: str, name: str, *, number: bool = False) -> str:
    if isinstance(value, str):
        return value
    if number and isinstance(value, (bool, int, float)):  # a label: JSON's own spelling of it
        return json.dumps(value)
    kind = "null" if value is None else type(value).__name__
    raise DataError(f"{where}: field '{name}' is {kind}, not text")


def jsonl_rows(path: Path, fields: tuple[str, ...], *, numbers: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The ``fields`` of each JSON record (one per line; blank lines are skipped); those in
    ``numbers`` (labels) may also be JSON numbers or booleans, given as their JSON text."""
    for number, line in enumerate(text.lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except RecursionError:
            raise DataError(f"{where}: the JSON record is nested too deeply") from None
        except ValueError as exc:
            raise DataError(f"{where}: not a JSON record ({str(exc)[:80]})") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: a JSON record is an object ({{...}}), not {type(record).__name__}")
        values = []
        for name in fields:
            try:
                value = _field(record, name)
            except KeyError:
                hint = did_you_mean(name, _names(record))
                raise ColumnError(f"{where}: no field '{name}' (data.columns){hint}", column=name) from None
            values.append(_text_of(value, where, name, number=name in numbers))
        yield tuple(values)


def table_rows(path: Path, fields: tuple[str, ...], *, delimiter: str) -> Iterator[tuple[str, ...]]:
    """The ``fields`` (header names) of each row of a CSV or TSV file with a header row; quoted cells
    may span lines. The csv module's field limit is process-wide: raised while any table is being
    read, then given back."""
    _raise_field_limit()
    reader = csv.reader((line + "\n" for line in text.lines(path)), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path} is empty")
        missing = [name for name in fields if name not in header]
        if missing:
            close = difflib.get_close_matches(missing[0], header[:MAX_NAMES], n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ColumnError(
                f"{path}:1: no column {', '.join(repr(m) for m in missing)} in the header (data.columns); "
                f"it has {', '.join(map(repr, header[:20]))}{hint}",
                column=missing[0],
            )
        columns = [header.index(name) for name in fields]
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path}:{reader.line_num}: {len(row)} cells, but the header has {len(header)}")
            yield tuple(row[c] for c in columns)
    except csv.Error as exc:
        raise DataError(
            f"{path}:{reader.line_num}: not a well-formed {'TSV' if delimiter == chr(9) else 'CSV'} row ({exc})"
        ) from None
    finally:
        _give_back_field_limit()


# The caller's csv field limit, kept while tables are read (several may be read at once, interleaved).
_field_limit: list[int] = []
_readers = 0


def _raise_field_limit() -> None:
    global _readers
    if _readers == 0:
        _field_limit[:] = [csv.field_size_limit(MAX_FIELD)]
    _readers += 1


def _give_back_field_limit() -> None:
    global _readers
    _readers -= 1
    if _readers == 0:
        csv.field_size_limit(_field_limit.pop())
