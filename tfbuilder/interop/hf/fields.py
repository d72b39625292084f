"""Reading one ``config.json`` field: the shared checks of every family's converter (a value that
is not a positive size, a finite number or one of the allowed choices is refused, naming the field)."""

from __future__ import annotations

import math
import reprlib
from typing import Any

from tfbuilder.errors import TfbuilderError


class UnsupportedConfig(TfbuilderError):
    """A Hugging Face config that tfbuilder cannot reproduce exactly (exit 2)."""


# A size (width, layers, vocabulary, positions) beyond any published model: a config asking for more
# is damaged or hostile, and is refused by its key before anything is built.
MAX_SIZE = 1 << 24
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlong = 3, 40, 40, 4, 4, 40


def shown(value: Any) -> str:
    """A config value as a message shows it: bounded, however long or deeply nested it is."""
    return _REPR.repr(value)


def require(cfg: dict, field: str, allowed: tuple, default: Any = None) -> Any:
    value = cfg.get(field, default)
    if not any(type(value) is type(a) and value == a for a in allowed):  # 1 is not True; a list is no choice
        choices = ", ".join(repr(a) for a in allowed)
        raise UnsupportedConfig(f"config.json: {field}: {shown(value)} is not supported (supported: {choices})")
    return value


def read_int(cfg: dict, field: str, default: Any = None) -> int:
    """A positive size, at most MAX_SIZE (``null`` means ``default``, as in transformers)."""
    value = cfg.get(field)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedConfig(f"config.json: {field}: expected a positive integer, got {shown(value)}")
    if value > MAX_SIZE:
        raise UnsupportedConfig(
            f"config.json: {field}: {value:.3g} is larger than any model tfbuilder builds (at most {MAX_SIZE:,})"
        )
    return value


def read_float(cfg: dict, field: str, default: float) -> float:
    value = cfg.get(field, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedConfig(f"config.json: {field}: expected a number, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise UnsupportedConfig(f"config.json: {field}: expected a finite number, got {shown(value)}")
    return number
