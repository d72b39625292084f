"""Validation errors as problems a person can act on: pydantic's errors placed at the file, line and
column where each value was written, under its dotted path, with "did you mean" for unknown keys and
the rejected value shown (schema only, no tensors)."""

from __future__ import annotations

import datetime
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from tfbuilder import registry
from tfbuilder.errors import Problem, did_you_mean
from tfbuilder.spec.slots import slot_family
from tfbuilder.spec.sources import Source

MAX_SUGGESTIONS = 100  # unknown keys of one recipe that get a "did you mean"


def translate(exc: ValidationError, src: Source, schema: type[BaseModel]) -> list[Problem]:
    """Pydantic errors -> problems with file, line, column, dotted path and a helpful message
    (``schema``, the model that validated ``src``, is searched for the keys an unknown one may mean)."""
    merged: dict[tuple, tuple[str, str, Any]] = {}  # data path -> (kind, message, input)
    suggestions = MAX_SUGGESTIONS  # "did you mean" costs a fuzzy search: thousands of unknown keys get none
    for err in exc.errors(include_url=False):
        if err["type"] == "cross_field":  # our own checks name real paths, defaults included
            loc, branch = tuple(err["loc"]), False
        else:
            named = err["type"] in ("missing", "extra_forbidden")
            loc, branch = _data_path(tuple(err["loc"]), src.data, named=named)
        kind, message = err["type"], err["msg"]
        if kind == "extra_forbidden":
            key = loc[-1]
            cls = _model_at(loc[:-1], src.data, schema)
            suggestions -= 1
            message = f"unknown key '{key}'" + (_suggest(str(key), loc[:-1], cls, schema) if suggestions >= 0 else "")
        elif kind == "missing":
            what = f"item [{loc[-1]}]" if isinstance(loc[-1], int) else f"required key '{loc[-1]}'"
            message = f"missing {what}"
        if loc in merged and branch:
            # One value failing every member of a union (e.g. `int | 'auto'`): one line, alternatives joined.
            _, earlier, got = merged[loc]
            merged[loc] = (kind, f"{earlier}, or {message.removeprefix('Input should be ')}", got)
        else:
            merged[loc] = (kind, message, err.get("input"))
    problems = []
    for loc, (kind, message, got) in merged.items():
        if kind.startswith("component_") and (*loc, "type") in src.values:
            loc = (*loc, "type")
        elif kind not in ("extra_forbidden", "missing", "cross_field") and not kind.startswith("component_"):
            if isinstance(got, (str, int, float, bool)) or got is None:
                message = f"{message} (got {got!r})"
            elif isinstance(got, (datetime.date, datetime.datetime)):
                message = f"{message} (YAML reads {got.isoformat()} as a date: quote it, '{got.isoformat()}')"
        problems.append(src.problem(loc, message, key=kind in ("extra_forbidden", "missing")))
    problems.sort(key=lambda p: (p.file or "", p.line or 0, p.col or 0))
    return problems


def _suggest(key: str, here: tuple, cls: type[BaseModel] | None, schema: type[BaseModel]) -> str:
    """The "did you mean" for an unknown ``key`` in the mapping at ``here`` (validated by ``cls``): the same
    key in another section of the recipe (``trainer.lr`` -> ``optim.lr``, ``data.max_steps`` ->
    ``trainer.max_steps``); else a close key of the same mapping, or its choices when few."""
    fields = cls.model_fields if cls is not None else {}
    if len(here) <= 1 and key not in fields:  # a top-level key, or one of a section: look in the others
        for name, field in schema.model_fields.items():
            section = _first_model(field.annotation)
            if section is not None and (name,) != here and key in section.model_fields:
                return f"; did you mean '{name}.{key}'?"
    return did_you_mean(key, fields) if fields else ""


def _data_path(loc: tuple, data: Any, *, named: bool) -> tuple[tuple, bool]:
    """Drop the parts of a pydantic location that are not in the data (union branch names such as
    ``int`` or ``literal['auto']``); returns the path and whether anything was dropped."""
    path: list[Any] = []
    node = data
    dropped = False
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif last and named:
            pass  # a key that is missing, or unknown, is still named
        else:
            dropped = True
            continue
        path.append(part)
    return tuple(path), dropped


def _model_at(loc: tuple, data: Any, schema: type[BaseModel]) -> type[BaseModel] | None:
    """The schema class that validates the mapping at ``loc`` (for 'did you mean' on unknown keys)."""
    cls: type[BaseModel] | None = schema
    node = data
    for part in loc:
        if cls is None or part not in cls.model_fields:
            return None
        node = node.get(part) if isinstance(node, dict) else None
        field = cls.model_fields[part]
        family = slot_family((field.annotation, *field.metadata))
        if family is not None:
            name = node.get("type") if isinstance(node, dict) else None
            cls = registry.get(family, name).params if name in registry.types(family) else None
        else:
            cls = _first_model(field.annotation)
    return cls


def _first_model(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model in ``annotation`` (``StackSection | None`` -> StackSection), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _first_model(arg)
        if found:
            return found
    return None


__all__ = ["MAX_SUGGESTIONS", "translate"]
