"""Labels of labelled data: kept beside the prepared tokens, turned into class ids or numbers per run.

The prepared store keeps each split's labels as written (``<split>.labels.json``: the source file, the
record number of every example kept, its label), so one store serves any label mapping. A run then
settles its mapping (:func:`tfbuilder.data.settle.settle`): the names of ``model.head.labels``, or else those of the
training split, sorted (numerically when every one is an integer: then the names are 0..classes-1).
The mapping is recorded in the run's recipe (``model.head.labels``), so the checkpoint carries it and
``tfbuilder predict`` writes names. A label of the validation or test split outside the mapping, a
training split with more or fewer labels than ``model.head.classes``, or a value that is not a number
(regression) is a :class:`DataError` naming the file and the record.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfbuilder.data import storefiles
from tfbuilder.errors import DataError
from tfbuilder.specials import LANGUAGE_MODEL_ADDED

SUFFIX = ".labels.json"
INTEGER = re.compile(r"^[+-]?\d{1,18}$")
SHOWN = 10  # label names listed in an error


@dataclass
class Collected:
    """The labels of the examples a split kept, with their record numbers (1 = the first record)."""

    records: list[int] = field(default_factory=list)
    values: list[str] = field(default_factory=list)

    def add(self, records: list[int], values: list[str]) -> None:
        self.records.extend(records)
        self.values.extend(values)


def write(directory: Path, split: str, source: str | Path, collected: Collected) -> None:
    """``<directory>/<split>.labels.json`` (inside a store being prepared: renamed into place whole)."""
    data = {"file": str(source), "records": collected.records, "labels": collected.values}
    (directory / f"{split}{SUFFIX}").write_text(json.dumps(data), encoding="utf-8")


def read(store: Path, split: str) -> tuple[str, list[int], list[str]]:
    """(source file, record numbers, labels) of a prepared split; a :class:`DataError` if damaged."""
    path = store / f"{split}{SUFFIX}"
    try:
        data = json.loads(storefiles.read_bounded(path, storefiles.MAX_TEXT_BYTES).decode("utf-8"))
        file, records, values = data["file"], data["records"], data["labels"]
        if not (
            isinstance(file, str)
            and isinstance(records, list)
            and isinstance(values, list)
            and len(records) == len(values)
        ):
            raise ValueError("unexpected content")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise DataError(f"the prepared data in {store} is damaged ({path.name}: {str(exc)[:120]})") from None
    return file, records, values


def _listed(names: list[str]) -> str:
    shown = ", ".join(map(repr, names[:SHOWN]))
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def names_of(values: list[str], classes: int, file: str) -> list[str]:
    """The class names of a training split's labels: sorted, numerically when all are integers
    (then 0..classes-1, each label one of them); exactly ``classes`` of them."""
    distinct = set(values)
    if distinct and all(INTEGER.match(v) for v in distinct):
        wrong = sorted((v for v in distinct if not 0 <= int(v) < classes), key=int)
        if wrong:
            raise DataError(
                f"{file}: integer labels are class ids 0..{classes - 1} (model.head.classes {classes}); "
                f"found {_listed(wrong)}"
            )
        return [str(i) for i in range(classes)]
    names = sorted(distinct)
    if len(names) != classes:
        raise DataError(
            f"{file}: the training split has {len(names)} labels ({_listed(names)}), "
            f"but model.head.classes is {classes}"
        )
    return names


def class_ids(values: list[str], records: list[int], names: list[str], file: str) -> np.ndarray:
    """The class id of each label; an unknown one is an error naming the file and the record."""
    index = {name: i for i, name in enumerate(names)}
    if all(INTEGER.match(n) for n in names):  # "01", "+1" and JSON's 1 mean class 1
        index.update({v: int(v) for v in set(values) if INTEGER.match(v) and 0 <= int(v) < len(names)})
    out = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        found = index.get(value)
        if found is None:
            raise DataError(
                f"{file}: record {records[i]}: label {value[:80]!r} is not one of the model's labels ({_listed(names)})"
            )
        out[i] = found
    return out


def numbers(values: list[str], records: list[int], file: str) -> np.ndarray:
    """Regression targets: each label a finite number; anything else names the file and the record."""
    out = np.empty(len(values), dtype=np.float32)
    for i, value in enumerate(values):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise DataError(
                f"{file}: record {records[i]}: label {value[:80]!r} is not a finite number (model.head.type regress)"
            )
        out[i] = number
    return out


def positions(split) -> np.ndarray:
    """Positions each example of a labelled split takes: <s> text </s> [pair </s>]."""
    total = split.src.lengths.astype(np.int64) + LANGUAGE_MODEL_ADDED
    if split.tgt is not None:
        total = total + split.tgt.lengths.astype(np.int64) + 1
    return total
