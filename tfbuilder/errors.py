"""Errors a user can cause: each problem carries where it is (file, line, column, dotted path)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe, printed as ``file:line:col: dotted.path: message``."""

    message: str
    path: str = ""
    file: str | None = None
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line or 1}:{self.col or 1}: "
        what = f"{self.path}: " if self.path else ""
        return printable(f"{where}{what}{self.message}")


# Characters that must not reach a terminal raw: C0 and C1 controls (escape sequences start with
# ESC or CSI), DEL, line and paragraph separators, and the bidirectional overrides that reorder text.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``), safe to print to a terminal: recipes,
    data and arguments may hold escape codes, and an error message echoes parts of them."""
    return _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


class TfbuilderError(Exception):
    """Base class of the errors tfbuilder raises on purpose: the CLI prints them, no traceback, and
    exits with ``exit_code`` (2: bad input, caught before anything ran)."""

    exit_code = 2


class DataError(TfbuilderError):
    """The data cannot be used (missing files, mismatched lines, too little text for the vocabulary...)."""


class ColumnError(DataError):
    """A record lacks a field that ``data.columns`` names (``column``: the name as written there)."""

    def __init__(self, message: str, *, column: str):
        super().__init__(message)
        self.column = column


class RecipeError(TfbuilderError):
    """A recipe is wrong: every problem found, at once."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or a list of the choices when none is close."""
    choices = sorted(set(choices))
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    if choices and len(choices) <= 12:
        return "; expected one of: " + ", ".join(f"'{c}'" for c in choices)
    return ""
