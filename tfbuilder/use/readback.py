"""Reading back what a run or sweep directory holds (no Lightning here).

Files in a run directory are input like any other: a copied, edited or damaged ``summary.json``,
``metrics.csv``, ``sweep.json`` or ``recipe.yaml`` goes through the same bounded readers as a recipe
file (a regular file, a size limit, bounded nesting, YAML aliases counted) and is reported by its
path as a :class:`DamagedFile` (exit 2), never as a traceback.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Literal, overload

from tfbuilder.errors import TfbuilderError

MAX_JSON_BYTES = 16 << 20  # summaries, scores and sweep plans are a few KiB
MAX_METRICS_BYTES = 256 << 20  # one row per logged step: millions of steps fit
MAX_JSON_DEPTH = 64


class DamagedFile(TfbuilderError):
    """A file tfbuilder wrote into a run or sweep directory cannot be read back as written."""


def read_bytes(path: Path, *, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (a FIFO, device or directory is refused unopened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise DamagedFile(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DamagedFile(f"{what} {path} is not a regular file")
        if info.st_size > limit:
            raise DamagedFile(f"{what} {path} is {info.st_size:,} bytes, more than the {limit:,} it may be")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise DamagedFile(f"cannot read {what} {path}: {exc.strerror or os.strerror(exc.errno or errno.EIO)}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise DamagedFile(f"{what} {path} is larger than the {limit:,} bytes it may be")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def read_json(path: Path, *, what: str) -> dict[str, Any]:
    """A JSON object written by tfbuilder (summary, scores, sweep plan), bounded in size and nesting."""
    text = read_bytes(path, limit=MAX_JSON_BYTES, what=what)
    try:
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        reason = (
            f"line {exc.lineno} column {exc.colno}: {exc.msg}"
            if isinstance(exc, json.JSONDecodeError)
            else "not JSON text"
        )
        raise DamagedFile(f"damaged {what} {path}: {reason}") from None
    if not isinstance(data, dict):
        raise DamagedFile(f"damaged {what} {path}: not a JSON object")
    if _depth(data) > MAX_JSON_DEPTH:
        raise DamagedFile(f"damaged {what} {path}: nested deeper than {MAX_JSON_DEPTH} levels")
    return data


@overload
def number(data: dict[str, Any], key: str, path: Path, *, what: str, optional: Literal[False] = False) -> float: ...


@overload
def number(data: dict[str, Any], key: str, path: Path, *, what: str, optional: bool) -> float | None: ...


def number(data: dict[str, Any], key: str, path: Path, *, what: str, optional: bool = False) -> float | None:
    """``data[key]`` as a finite number (None when absent or null and ``optional``)."""
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DamagedFile(f"damaged {what} {path}: {key} is {'missing' if value is None else 'not a finite number'}")
    return float(value)


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a run's ``metrics.csv``; a row that is not CSV with a ``step`` column is damage."""
    text = read_bytes(path, limit=MAX_METRICS_BYTES, what="metrics log")
    try:
        rows = list(csv.DictReader(io.StringIO(text.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DamagedFile(f"damaged metrics log {path}: {exc}") from None
    if rows and "step" not in rows[0]:
        raise DamagedFile(f"damaged metrics log {path}: no step column")
    return rows


def metric(row: dict[str, str], key: str, path: Path, line: int) -> float | None:
    """One cell of a metrics row as a finite number, None when empty."""
    cell = row.get(key)
    if cell is None or cell == "":
        return None
    try:
        value = float(cell)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) and key == "step":
        raise DamagedFile(f"damaged metrics log {path}: line {line}: {key} is not a number")
    return value if math.isfinite(value) else None
