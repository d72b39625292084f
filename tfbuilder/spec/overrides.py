"""``--set dotted.key=value`` overrides over loaded recipe data: each value read as YAML with a
recipe file's bounds, and placed at the override that wrote it (``--set ...``, line 1, its column)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from tfbuilder.errors import Problem, RecipeError
from tfbuilder.spec.yaml_source import MAX_DEPTH, Mark, Source, dotted_path, parse_value, quote


def apply_overrides(src: Source, overrides: list[str] | tuple[str, ...]) -> Source:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML) over ``src``; every override's
    problem is reported, together."""
    problems: list[Problem] = []
    for text in overrides:
        try:
            override = _parse_override(text)
            _assign(src, _container(src, override), override)
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    return src


@dataclass(frozen=True)
class _Override:
    """One parsed ``--set``: the path into the data, its value, and where the value starts."""

    label: str  # "--set <text>", the source a problem points at
    parts: tuple  # ("model", "encoder", "layers"); list indices are ints
    value: Any
    col: int

    @property
    def key(self) -> str:
        return dotted_path(self.parts)

    def problem(self, message: str, *, col: int = 1) -> RecipeError:
        return RecipeError([Problem(message, self.key, self.label, 1, col)])


def _parse_override(text: str) -> _Override:
    """``dotted.key=value`` -> its path and YAML value; a RecipeError for a malformed one."""
    label = f"--set {text}"
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecipeError([Problem("an override must look like dotted.key=value", "", label, 1, 1)])
    if key.count(".") >= MAX_DEPTH:  # checked before splitting: a 20,000-part path is refused at once
        raise RecipeError(
            [
                Problem(
                    f"the key path has {key.count('.') + 1:,} parts; a recipe is nested at most {MAX_DEPTH} levels",
                    "",
                    label[:200],
                    1,
                    1,
                )
            ]
        )
    parts = tuple(int(p) if p.isdigit() else p for p in key.split("."))
    if any(p == "" for p in parts):
        raise RecipeError([Problem("empty key in the dotted path", key, label, 1, 1)])
    col = len(text) - len(raw) + 1
    override = _Override(label, parts, None, col)
    if parts[0] == "extends":
        raise override.problem("extends cannot be overridden: edit the recipe or extend it")
    try:
        value = parse_value(raw, label) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise override.problem(f"cannot parse value {quote(raw)}: {getattr(exc, 'problem', exc)}", col=col) from None
    except RecipeError as exc:  # the same bounds as in a file: nesting, aliases, tags
        raise RecipeError([Problem(p.message, override.key, label, 1, col) for p in exc.problems]) from None
    return _Override(label, parts, value, col)


def _container(src: Source, override: _Override) -> dict | list:
    """The mapping or list that holds the override's last key, walked from the top; missing
    mappings on the way are created (and placed at the override)."""
    node: Any = src.data
    for i, part in enumerate(override.parts[:-1]):
        nxt = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, list) and isinstance(part, int) and part < len(node):
            nxt = node[part]
        if nxt is None and isinstance(node, dict):
            nxt = node[part] = {}
            created = override.parts[: i + 1]
            src.values[created] = src.keys[created] = Mark(override.label, 1, 1)
        if not isinstance(nxt, (dict, list)):
            raise override.problem(
                f"cannot set {override.key}: {dotted_path(override.parts[: i + 1])} is not a mapping"
            )
        node = nxt
    return node


def _assign(src: Source, node: dict | list, override: _Override) -> None:
    """Set the override's value in ``node`` and record where it came from."""
    last, value = override.parts[-1], override.value
    if isinstance(node, list) and (not isinstance(last, int) or last >= len(node)):
        raise override.problem(f"index {last} is out of range")
    if last == "type" and isinstance(node, dict) and node.get("type") not in (None, value):
        node.clear()  # a new component type starts from its own defaults (see _retyped)
        src.forget(override.parts[:-1], below_only=True)
    node[last] = value
    src.forget(override.parts)
    src.values[override.parts] = Mark(override.label, 1, override.col)
    src.keys[override.parts] = Mark(override.label, 1, 1)
