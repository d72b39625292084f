"""Markdown text for the generated reference pages: code spans, escaped prose, tables, and values as
a recipe writes them. Escaping is strict because help texts hold ``<output>``, ``last|best`` and
underscores that Markdown would read as markup."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any

import yaml

_CODE_SPAN = re.compile(r"``(.+?)``|`([^`]+)`")
_SPECIAL = re.compile(r"([\\*_\[\]|<>&])")


def _escape_plain(text: str) -> str:
    """Text outside code spans, made literal: Markdown emphasis, links, table pipes and HTML tags
    (``<output>``) would otherwise be read as markup."""

    def one(match: re.Match) -> str:
        char = match.group(1)
        return {"<": "&lt;", ">": "&gt;", "&": "&amp;"}.get(char, "\\" + char)

    return _SPECIAL.sub(one, text)


def code(text: str) -> str:
    """``text`` as an inline code span. Text holding a pipe (``last|best``) is written as escaped plain
    text instead: it may sit in a table cell, and Markdown dialects disagree on pipes in code spans."""
    if "|" in text:
        return _escape_plain(text)
    return "`" + text + "`"


def prose(text: str) -> str:
    """Docstring or help text as Markdown: reST ``literals`` and Markdown `literals` become code
    spans, everything else is escaped."""
    out, last = [], 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_escape_plain(text[last : match.start()]))
        out.append(code(match.group(1) or match.group(2)))
        last = match.end()
    out.append(_escape_plain(text[last:]))
    return "".join(out)


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    if not doc:
        return ""
    paragraph = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (cells are already Markdown)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def yaml_value(value: Any) -> str:
    """``value`` as it would be written in a recipe (flow style, one line)."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def number(value: Any) -> str:
    """A bound, readable: thousands separated."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 10_000:
        return f"{value:,.1f}"
    return repr(value)
