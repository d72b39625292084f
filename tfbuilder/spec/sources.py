"""Recipe files: read one (a regular UTF-8 file of bounded size), follow its ``extends`` chain, and
deep-merge the chain, keeping where each value was written. YAML with positions is
:mod:`tfbuilder.spec.yaml_source`; ``--set`` overrides are :mod:`tfbuilder.spec.overrides`
(both re-exported here)."""

from __future__ import annotations

import copy
import difflib
import errno
import os
import re
import stat
from pathlib import Path

from tfbuilder.errors import Problem, RecipeError
from tfbuilder.spec.overrides import apply_overrides
from tfbuilder.spec.yaml_source import (
    MAX_DEPTH,
    MAX_VALUES,
    Key,
    Loader,
    Mark,
    Source,
    Written,
    check_bounds,
    dotted_path,
    parse_yaml,
)
from tfbuilder.streams import describe

MAX_RECIPE_BYTES = 1 << 18  # a recipe is a page of YAML; 256 KiB is far beyond any real one (~2 s to scan)
MAX_EXTENDS = 32  # files in one extends chain (a recipe needs 2 or 3)
RECIPE_SECTIONS = ("name", "extends", "model", "data", "optim", "trainer")
# Paths a recipe file writes relative to its own folder, as ``extends`` is (``--set`` values and
# recipes built in Python stay relative to the working directory).
FILE_RELATIVE: tuple[Key, ...] = (("data", "path"), ("data", "tokenizer", "path"))


def read_recipe_text(path: Path, shown: str) -> str:
    """The text of a recipe file: a regular file (not a directory, FIFO or device) of at most
    MAX_RECIPE_BYTES, in UTF-8. Raises OSError or UnicodeDecodeError with a reason to show."""
    # Open without blocking (a FIFO would wait for a writer), then look at what was opened.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else f"not a regular file ({describe(path)})"
            raise OSError(errno.EINVAL, f"{shown} is {kind}")
        if info.st_size > MAX_RECIPE_BYTES:
            raise OSError(errno.EFBIG, f"{shown} is {info.st_size:,} bytes; a recipe is at most {MAX_RECIPE_BYTES:,}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECIPE_BYTES:  # the file grew while we read it
        raise OSError(errno.EFBIG, f"{shown} is larger than {MAX_RECIPE_BYTES:,} bytes, the most a recipe may be")
    return data.decode("utf-8")


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # elsewhere, or a symlink loop
        return str(path)


def load_source(path: str | Path) -> Source:
    """Load ``path`` and everything it ``extends``, deep-merged (mappings merge, lists are replaced).

    The chain is followed in a loop, at most MAX_EXTENDS files long; cycles are errors."""
    path = Path(path)
    chain: list[Source] = []
    seen: list[Path] = []
    via: Problem | None = None
    while True:
        src = _read_one(path, via=via, first=not chain)
        anchor(src, path)
        chain.append(src)
        seen.append(_resolved(path, src))
        parent_name = src.data.get("extends")
        if parent_name is None:
            src.data.pop("extends", None)
            break
        if not isinstance(parent_name, str) or not parent_name.strip():
            raise RecipeError(
                [src.problem(("extends",), "extends must be a path to another recipe (relative to this one)")]
            )
        if "\x00" in parent_name:
            raise RecipeError([src.problem(("extends",), "a path cannot hold a NUL byte")])
        parent_path = path.parent / parent_name
        resolved = _resolved(parent_path, src)
        if resolved in seen:
            loop = " -> ".join(_display(p) for p in seen + [resolved])
            raise RecipeError([src.problem(("extends",), f"extends cycle: {loop}")])
        if len(chain) >= MAX_EXTENDS:
            raise RecipeError([src.problem(("extends",), f"extends chain longer than {MAX_EXTENDS} files")])
        via = src.problem(("extends",), f"extends a file that does not exist: {_display(resolved)}")
        path = parent_path
    merged = chain.pop()
    while chain:
        child = chain.pop()
        # ``name`` and ``extends`` belong to each file: a child does not inherit its parent's name.
        merged.data.pop("name", None)
        child.data.pop("extends", None)
        merged = merge(merged, child)
    return merged


def anchor(src: Source, path: Path) -> None:
    """Make the relative paths of FILE_RELATIVE that ``path``'s file wrote relative to its folder:
    absolute, so that they mean the same from any working directory and in the run's recorded recipe.
    The value as written is kept (``src.written``): where no such folder exists, the data layer falls
    back to it, read from the working directory as before. No file is looked at here."""
    for key in FILE_RELATIVE:
        *parents, last = key
        node: object = src.data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        value = node.get(last) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(value, str) or not value.strip() or "\x00" in value:
            continue
        if os.path.isabs(value):
            continue
        node[last] = os.path.normpath(os.path.join(os.path.abspath(path.parent), value))
        src.written[key] = Written(value, str(path))


def _resolved(path: Path, src: Source | None) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: reported when the file is read
        return path.absolute()


def _read_one(path: Path, *, via: Problem | None, first: bool) -> Source:
    shown = _display(path)
    try:
        text = read_recipe_text(path, shown)
    except FileNotFoundError:
        raise RecipeError([via or Problem(f"no such recipe file: {shown}", "", shown, 1, 1)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
            reason = "too many levels of symbolic links (a symlink loop)"
        elif isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
        else:
            reason = f"not UTF-8 text (byte {exc.start:,})"
        if via is not None:  # report it where the parent is named
            raise RecipeError(
                [Problem(f"extends {shown}, which cannot be read: {reason}", via.path, via.file, via.line, via.col)]
            ) from None
        raise RecipeError([Problem(f"cannot read recipe: {reason}", "", shown, 1, 1)]) from None
    try:
        src = parse_yaml(text, shown)
    except RecipeError as exc:
        if via is not None and not _looks_like_yaml_recipe(text):
            raise RecipeError([_not_a_recipe(via, shown)]) from None
        raise exc from None
    if not any(key in RECIPE_SECTIONS for key in src.data):
        # Not a recipe at all (``extends: /etc/passwd``): say so, without echoing what it holds. A file
        # named on the command line whose keys are near misses (``modle:``) gets "did you mean" instead.
        if via is not None:
            raise RecipeError([_not_a_recipe(via, shown)])
        if not any(difflib.get_close_matches(str(key), RECIPE_SECTIONS, n=1, cutoff=0.6) for key in src.data):
            raise RecipeError(
                [Problem(f"not a recipe: none of its top-level keys is {', '.join(RECIPE_SECTIONS)}", "", shown, 1, 1)]
            )
    return src


def _looks_like_yaml_recipe(text: str) -> bool:
    return any(re.match(rf"^{key}\s*:", line) for line in text.splitlines()[:200] for key in RECIPE_SECTIONS)


def _not_a_recipe(via: Problem, shown: str) -> Problem:
    return Problem(
        f"extends {shown}, which is not a recipe (no {', '.join(RECIPE_SECTIONS[1:])} section)",
        via.path,
        via.file,
        via.line,
        via.col,
    )


def merge(base: Source, top: Source) -> Source:
    """Deep-merge ``top`` over ``base``: mappings merge key by key, anything else replaces.

    Linear in the number of keys: the data is merged first, noting which paths ``top`` replaced;
    then each recorded place is kept or taken from ``top`` by looking at its own path's prefixes
    (at most MAX_DEPTH of them), never by scanning the tables once per key."""
    data = copy.deepcopy(base.data)
    replaced: set[Key] = set()  # paths whose value top replaces (its places there and below win)
    merged: set[Key] = set()  # mappings present on both sides, merged key by key

    def visit(dst: dict, src: dict, path: Key) -> None:
        for key, value in src.items():
            p = path + (key,)
            if isinstance(value, dict) and isinstance(dst.get(key), dict) and not _retyped(dst[key], value):
                merged.add(p)
                visit(dst[key], value, p)
            else:
                replaced.add(p)
                dst[key] = copy.deepcopy(value)

    visit(data, top.data, ())

    def below_replaced(k: Key, *, inclusive: bool) -> bool:
        return any(k[:i] in replaced for i in range(1, len(k) + (1 if inclusive else 0)))

    out = Source(data)
    for table, mine, theirs in ((out.values, base.values, top.values), (out.keys, base.keys, top.keys)):
        table.update((k, m) for k, m in mine.items() if not below_replaced(k, inclusive=False))
        table.update((k, m) for k, m in theirs.items() if k in merged or below_replaced(k, inclusive=True))
    # A path as written belongs to the file whose value wins.
    out.written.update((k, w) for k, w in base.written.items() if not below_replaced(k, inclusive=True))
    out.written.update(top.written)
    return out


def _retyped(old: dict, new: dict) -> bool:
    """A component whose ``type`` changes is replaced, not merged: its old params may not apply."""
    return "type" in new and "type" in old and new["type"] != old["type"]


__all__ = [
    "FILE_RELATIVE",
    "MAX_DEPTH",
    "MAX_EXTENDS",
    "MAX_RECIPE_BYTES",
    "MAX_VALUES",
    "RECIPE_SECTIONS",
    "Loader",
    "Mark",
    "Source",
    "Written",
    "anchor",
    "apply_overrides",
    "check_bounds",
    "dotted_path",
    "load_source",
    "merge",
    "parse_yaml",
    "read_recipe_text",
]
