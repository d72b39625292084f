"""YAML with positions: load a recipe file, follow ``extends``, apply ``--set`` overrides.

Every value keeps the place it came from (file, line, column), so that schema errors found later
can point at it. Only ``yaml.safe_load``-level constructs are accepted: recipes are data.
"""

from __future__ import annotations

import copy
import difflib
import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tfbuilder.errors import Problem, RecipeError, printable

_PLAIN_TAGS = tuple(
    f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp")
)
_MERGE = "tag:yaml.org,2002:merge"
Key = tuple  # a path into the data: ("model", "encoder", "layers")

# Hostile input is input: what a recipe file can make us read, allocate or recurse into is bounded.
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; 1 MiB is far beyond any real one
MAX_DEPTH = 64  # nesting of mappings and lists (a recipe needs about 5)
MAX_VALUES = 100_000  # values after YAML aliases are expanded (a recipe has a few hundred)
MAX_EXTENDS = 32  # files in one extends chain (a recipe needs 2 or 3)
RECIPE_SECTIONS = ("name", "extends", "model", "data", "optim", "trainer")


@dataclass(frozen=True)
class Mark:
    """A place in a source: ``file`` is a path, or ``--set ...`` for an override."""

    file: str
    line: int
    col: int


@dataclass
class Source:
    """Recipe data plus where each key and value came from."""

    data: dict[str, Any]
    values: dict[Key, Mark] = field(default_factory=dict)  # path -> where its value starts
    keys: dict[Key, Mark] = field(default_factory=dict)  # path -> where its key is written

    def mark(self, path: Key, *, key: bool = False) -> Mark | None:
        """The closest known place for ``path``: itself, else its nearest ancestor."""
        table = self.keys if key else self.values
        for n in range(len(path), -1, -1):
            found = table.get(tuple(path[:n])) or self.values.get(tuple(path[:n]))
            if found is not None:
                return found
        return None

    def forget(self, path: Key, *, below_only: bool = False) -> None:
        """Drop the recorded places of ``path`` and everything below it (only below it with
        ``below_only``): its value is being replaced, and the old places would point at text that no
        longer says what the data holds."""
        start = len(path) + 1 if below_only else len(path)
        for table in (self.values, self.keys):
            for k in [k for k in table if len(k) >= start and k[: len(path)] == path]:
                del table[k]

    def problem(self, path: Key, message: str, *, key: bool = False) -> Problem:
        where = self.mark(path, key=key)
        dotted = dotted_path(path)
        if where is None:
            return Problem(message, dotted)
        return Problem(message, dotted, where.file, where.line, where.col)


def dotted_path(path: Key) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def check_bounds(data: Any, where: str) -> None:
    """Refuse recipe data kept elsewhere (a checkpoint's) that a recipe file could not hold: nesting
    deeper than MAX_DEPTH or more than MAX_VALUES values. Iterative: deep data cannot recurse here."""
    count, stack = 0, [(data, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise RecipeError([Problem(f"{where} holds more than {MAX_VALUES:,} values", "")])
        if depth > MAX_DEPTH:
            raise RecipeError([Problem(f"{where} is nested deeper than {MAX_DEPTH} levels", "")])
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


def _mark(file: str, node: yaml.Node) -> Mark:
    return Mark(file, node.start_mark.line + 1, node.start_mark.column + 1)


class _Budget:
    """What one file's construction may still spend: values (aliases expanded), and the nodes being
    constructed now (a node met again while it is being constructed is a recursive alias)."""

    def __init__(self) -> None:
        self.values = MAX_VALUES
        self.open: set[int] = set()


def _construct(
    node: yaml.Node, file: str, path: Key, src: Source, problems: list[Problem], budget: _Budget | None = None
) -> Any:
    """Turn a composed node into plain data, recording marks; duplicate keys are errors.

    Bounded: at most MAX_DEPTH levels and MAX_VALUES values however aliases multiply them, and a
    node that contains itself (``&a [*a]``) is an error, not an endless recursion."""
    budget = budget or _Budget()
    budget.values -= 1
    if budget.values < 0:
        raise RecipeError(
            [
                Problem(
                    f"YAML aliases expand this recipe to more than {MAX_VALUES:,} values",
                    dotted_path(path),
                    *_pos(file, node),
                )
            ]
        )
    if len(path) > MAX_DEPTH:
        raise RecipeError([Problem(f"nested deeper than {MAX_DEPTH} levels", "", *_pos(file, node))])
    if id(node) in budget.open:
        raise RecipeError(
            [Problem("recursive YAML alias: this value contains itself", dotted_path(path), *_pos(file, node))]
        )
    src.values[path] = _mark(file, node)
    if node.tag not in _PLAIN_TAGS:
        problems.append(
            Problem(
                f"YAML tag {_quote(node.tag)} is not allowed: recipes are plain data",
                dotted_path(path),
                *_pos(file, node),
            )
        )
        return None
    if isinstance(node, yaml.ScalarNode):
        return _scalar_at(node, file, path, problems)
    budget.open.add(id(node))
    try:
        if isinstance(node, yaml.MappingNode):
            return _construct_mapping(node, file, path, src, problems, budget)
        return [_construct(item, file, path + (i,), src, problems, budget) for i, item in enumerate(node.value)]
    finally:
        budget.open.discard(id(node))


def _construct_mapping(
    node: yaml.MappingNode, file: str, path: Key, src: Source, problems: list[Problem], budget: _Budget
) -> dict:
    out: dict[Any, Any] = {}
    owned: set[str] = set()
    # YAML merge keys (`<<: *base`) as yaml.safe_load reads them, but without changing the node:
    # a mapping used again through an alias must read the same the second time.
    for key_node, value_node, inherited in _pairs(node, file, path, problems, budget, depth=0):
        key = _scalar(key_node) if isinstance(key_node, yaml.ScalarNode) and key_node.tag in _PLAIN_TAGS else None
        if not isinstance(key, (str, int, float, bool)):
            problems.append(
                Problem("keys must be plain scalars (text or numbers)", dotted_path(path), *_pos(file, key_node))
            )
            continue
        key = str(key) if not isinstance(key, str) else key
        if key in out and key in owned and not inherited:
            first = src.keys[path + (key,)]
            problems.append(
                Problem(
                    f"duplicate key {_quote(key)} (first at line {first.line})",
                    dotted_path(path + (key,)),
                    *_pos(file, key_node),
                )
            )
            continue
        if not inherited:
            owned.add(key)
        src.keys[path + (key,)] = _mark(file, key_node)
        out[key] = _construct(value_node, file, path + (key,), src, problems, budget)
    return out


def _pairs(
    node: yaml.MappingNode, file: str, path: Key, problems: list[Problem], budget: _Budget, depth: int
) -> list[tuple]:
    """``(key, value, inherited)`` in construction order: merged-in pairs first (the first mapping
    named by ``<<`` wins), then the mapping's own (which override them)."""
    if depth > MAX_DEPTH:
        raise RecipeError(
            [Problem(f"YAML merge keys nested deeper than {MAX_DEPTH} levels", dotted_path(path), *_pos(file, node))]
        )
    merged: list[tuple] = []
    own: list[tuple] = []
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE:
            own.append((key_node, value_node, False))
            continue
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for source in reversed(sources):  # later sources first, so that earlier ones override them
            if not isinstance(source, yaml.MappingNode):
                problems.append(
                    Problem(
                        "a merge key (<<) takes a mapping or a list of mappings", dotted_path(path), *_pos(file, source)
                    )
                )
                continue
            if id(source) in budget.open or source is node:
                raise RecipeError(
                    [Problem("recursive YAML alias in a merge key", dotted_path(path), *_pos(file, source))]
                )
            budget.open.add(id(source))
            try:
                merged += [(k, v, True) for k, v, _ in _pairs(source, file, path, problems, budget, depth + 1)]
            finally:
                budget.open.discard(id(source))
            budget.values -= len(source.value)
            if budget.values < 0:
                raise RecipeError(
                    [
                        Problem(
                            f"YAML aliases expand this recipe to more than {MAX_VALUES:,} values",
                            dotted_path(path),
                            *_pos(file, node),
                        )
                    ]
                )
    return merged + own


def _scalar_at(node: yaml.ScalarNode, file: str, path: Key, problems: list[Problem]) -> Any:
    try:
        return _scalar(node)
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        reason = (
            "a number too large to read" if "digits" in str(exc) or "limit" in str(exc) else f"unreadable value ({exc})"
        )
        problems.append(Problem(reason, dotted_path(path), *_pos(file, node)))
        return None


def _quote(text: Any) -> str:
    """``text`` quoted for a message, control characters escaped (keys may hold terminal escapes)."""

    return "'" + printable(str(text)) + "'"


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-3`` as a float as YAML 1.2 does (YAML 1.1 wants ``1.0e-3``),
    refusing nesting deeper than MAX_DEPTH while composing (PyYAML's composer recurses per level)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_SCALAR_LOADER = Loader("")


def _scalar(node: yaml.Node) -> Any:
    try:
        value = _SCALAR_LOADER.construct_object(node, deep=True)
    finally:
        _SCALAR_LOADER.constructed_objects.clear()  # a module-level loader must not keep every value
    return value


def _pos(file: str, node: yaml.Node) -> tuple[str, int, int]:
    m = _mark(file, node)
    return (m.file, m.line, m.col)


def parse_yaml(text: str, file: str) -> Source:
    """Parse one YAML document (a mapping) into a :class:`Source`; YAML errors become problems."""
    try:
        node = yaml.compose(text, Loader=Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if exc.context_mark is not None and "end of stream" in (exc.problem or ""):
            mark = exc.context_mark  # an unclosed quote or bracket: point where it opened
        msg = (exc.problem or str(exc)).strip()
        if exc.context:
            msg = f"{exc.context.strip()}: {msg}"
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise RecipeError([Problem(f"YAML syntax error: {msg}", "", file, line, col)]) from None
    except yaml.reader.ReaderError as exc:
        # A character YAML does not allow (a NUL, a terminal escape...): one problem, where it is.
        before = text[: exc.position]
        line, col = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        raise RecipeError(
            [Problem(f"YAML error: special character {what} is not allowed", "", file, line, col)]
        ) from None
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RecipeError([Problem(f"YAML error: {first}", "", file, 1, 1)]) from None
    if node is None:
        raise RecipeError([Problem("the recipe is empty", "", file, 1, 1)])
    src = Source({})
    problems: list[Problem] = []
    try:
        data = _construct(node, file, (), src, problems)
    except yaml.constructor.ConstructorError as exc:
        m = exc.problem_mark
        line, col = (m.line + 1, m.column + 1) if m else (1, 1)
        raise RecipeError([Problem(f"YAML error: {exc.problem}", "", file, line, col)]) from None
    if problems:
        raise RecipeError(problems)
    if not isinstance(data, dict):
        raise RecipeError(
            [Problem("a recipe must be a mapping of sections (model, data, optim, trainer)", "", file, 1, 1)]
        )
    src.data = data
    return src


def read_recipe_text(path: Path, shown: str) -> str:
    """The text of a recipe file: a regular file (not a directory, FIFO or device) of at most
    MAX_RECIPE_BYTES, in UTF-8. Raises OSError or UnicodeDecodeError with a reason to show."""
    # Open without blocking (a FIFO would wait for a writer), then look at what was opened.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, FIFO or socket)"
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
    return out


def _retyped(old: dict, new: dict) -> bool:
    """A component whose ``type`` changes is replaced, not merged: its old params may not apply."""
    return "type" in new and "type" in old and new["type"] != old["type"]


def _parse_value(raw: str, label: str) -> Any:
    """An override's value: YAML, read with the same bounds and rules as a recipe file."""
    node = yaml.compose(raw, Loader=Loader)
    if node is None:
        return None
    problems: list[Problem] = []
    value = _construct(node, label, (), Source({}), problems)
    if problems:
        raise RecipeError(problems)
    return value


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
        value = _parse_value(raw, label) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise override.problem(f"cannot parse value {_quote(raw)}: {getattr(exc, 'problem', exc)}", col=col) from None
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
