"""What every recipe section shares: the strict base model, and the raising of cross-field problems
(each at its own location, with the value that caused it) as one validation error."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Strict, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from tfbuilder.params import bounded

Issue = tuple[tuple[Any, ...], str, Any]
"""A cross-field problem: its location (keys below the section checked), the message, the value shown."""

MAX_SEED = 2**32 - 1  # numpy and the data order take 32-bit seeds

StrictFloat = Annotated[float, Strict()]
StrictInt = Annotated[int, Strict()]


class Section(BaseModel):
    """A recipe section: unknown keys are errors, no silent coercion (``yes`` is not 1.0), no inf/nan."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    _bounded = field_validator("*", mode="after")(bounded)  # no integer beyond MAX_INT


def fail(model: str, problems: list[Issue]) -> None:
    """Raise cross-field ``problems`` (loc, message, value) as one ValidationError, each at its loc."""
    if problems:
        details = [
            InitErrorDetails(type=PydanticCustomError("cross_field", message), loc=loc, input=value)
            for loc, message, value in problems
        ]
        raise ValidationError.from_exception_data(model, details)


def no_nul(value: str | None) -> str | None:
    """A path the operating system can open: no NUL byte (a path cannot hold one)."""
    if value is not None and "\x00" in value:
        raise PydanticCustomError("path_nul", "a path cannot hold a NUL byte")
    return value


__all__ = ["MAX_SEED", "Issue", "Section", "StrictFloat", "StrictInt", "fail", "no_nul"]
