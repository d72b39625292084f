"""Key-by-key differences between resolved recipes (``tfbuilder diff``)."""

from __future__ import annotations

from typing import Any

from tfbuilder.spec.recipe import Recipe

MISSING = object()


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"d_model": 512}}`` -> ``{"model.d_model": 512}``; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def differences(a: Recipe | dict, b: Recipe | dict, *, include_name: bool = False) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in a, value in b)`` for every resolved key whose values differ, defaults
    included (a key absent on one side shows as MISSING). A recipe may also be given as the data
    :meth:`Recipe.to_dict` made (a run's ``recipe.yaml``)."""
    left, right = (flatten(r.to_dict() if isinstance(r, Recipe) else r) for r in (a, b))
    keys = sorted(set(left) | set(right))
    return [
        (k, left.get(k, MISSING), right.get(k, MISSING))
        for k in keys
        if left.get(k, MISSING) != right.get(k, MISSING) and (include_name or k != "name")
    ]


def format_table(rows: list[tuple[str, Any, Any]], left: str, right: str) -> str:
    """The differences as an aligned text table."""
    shown = [(k, "-" if x is MISSING else str(x), "-" if y is MISSING else str(y)) for k, x, y in rows]
    header = ("key", left, right)
    widths = [max(len(r[i]) for r in [header, *shown]) for i in range(3)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in shown]
    return "\n".join(line.rstrip() for line in lines)
