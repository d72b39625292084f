"""YAML with positions: one recipe document read into plain data, every key and value keeping the
place it came from (file, line, column), so that schema errors found later can point at it.

Only ``yaml.safe_load``-level constructs are accepted (recipes are data), and what a file can make
us read, allocate or recurse into is bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from tfbuilder.errors import Problem, RecipeError, printable

_PLAIN_TAGS = tuple(
    f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp")
)
_MERGE = "tag:yaml.org,2002:merge"
Key = tuple  # a path into the data: ("model", "encoder", "layers")

# Hostile input is input: what a recipe file can make us read, allocate or recurse into is bounded.
MAX_DEPTH = 64  # nesting of mappings and lists (a recipe needs about 5)
MAX_VALUES = 100_000  # values after YAML aliases are expanded (a recipe has a few hundred)
MAX_NODES = 10_000  # values written in one file or --set value, before aliases (PyYAML composes ~20k/s)
MAX_LINE = 10_000  # characters on one line of a recipe (one line of flow YAML is parsed as slowly as many)


@dataclass(frozen=True)
class Mark:
    """A place in a source: ``file`` is a path, or ``--set ...`` for an override."""

    file: str
    line: int
    col: int


@dataclass(frozen=True)
class Written:
    """A relative path as a recipe file wrote it, and that file (the data layer's fallback reads it)."""

    value: str
    file: str


@dataclass
class Source:
    """Recipe data plus where each key and value came from."""

    data: dict[str, Any]
    values: dict[Key, Mark] = field(default_factory=dict)  # path -> where its value starts
    keys: dict[Key, Mark] = field(default_factory=dict)  # path -> where its key is written
    written: dict[Key, Written] = field(default_factory=dict)  # path -> a file-relative path as written

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
        for table in (self.values, self.keys, self.written):
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
                f"YAML tag {quote(node.tag)} is not allowed: recipes are plain data",
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
                    f"duplicate key {quote(key)} (first at line {first.line})",
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


def quote(text: Any) -> str:
    """``text`` quoted for a message, control characters escaped (keys may hold terminal escapes)."""

    return "'" + printable(str(text)) + "'"


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-3`` as a float as YAML 1.2 does (YAML 1.1 wants ``1.0e-3``),
    refusing nesting deeper than MAX_DEPTH while composing (PyYAML's composer recurses per level)."""

    _depth = 0
    _nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            if self._nodes > MAX_NODES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_NODES:,} values written", mark)
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
    _check_lines(text, file)
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


def _check_lines(text: str, file: str) -> None:
    """Refuse a line longer than MAX_LINE characters, where it is (before PyYAML scans it)."""
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > MAX_LINE:
            message = f"a line of {len(line):,} characters; recipe lines are at most {MAX_LINE:,}"
            raise RecipeError([Problem(message, "", file, number, 1)])


def parse_value(raw: str, label: str) -> Any:
    """An override's value: YAML, read with the same bounds and rules as a recipe file."""
    _check_lines(raw, label)
    node = yaml.compose(raw, Loader=Loader)
    if node is None:
        return None
    problems: list[Problem] = []
    value = _construct(node, label, (), Source({}), problems)
    if problems:
        raise RecipeError(problems)
    return value
