"""YAML with positions: load a recipe file, follow ``extends``, apply ``--set`` overrides.

Every value keeps the place it came from (file, line, column), so that schema errors found later
can point at it. Only ``yaml.safe_load``-level constructs are accepted: recipes are data.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import Problem, RecipeError

_PLAIN_TAGS = tuple(
    f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp")
)
_MERGE = "tag:yaml.org,2002:merge"
Key = tuple  # a path into the data: ("model", "encoder", "layers")


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

    def problem(self, path: Key, message: str, *, key: bool = False) -> Problem:
        where = self.mark(path, key=key)
        dotted = dotted_path(path)
        if where is None:
            return Problem(message, dotted)
        return Problem(message, dotted, where.file, where.line, where.col)


def dotted_path(path: Key) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def _mark(file: str, node: yaml.Node) -> Mark:
    return Mark(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _construct(node: yaml.Node, file: str, path: Key, src: Source, problems: list[Problem]) -> Any:
    """Turn a composed node into plain data, recording marks; duplicate keys are errors."""
    src.values[path] = _mark(file, node)
    if node.tag not in _PLAIN_TAGS:
        problems.append(Problem(f"YAML tag {node.tag!r} is not allowed: recipes are plain data", dotted_path(path), *_pos(file, node)))
        return None
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        own = sum(1 for k, _ in node.value if k.tag != _MERGE)
        _SCALAR_LOADER.flatten_mapping(node)  # YAML merge keys (`<<: *base`), as yaml.safe_load does
        inherited = len(node.value) - own  # pairs merged in from anchors: the mapping's own keys win
        owned: set[str] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = _scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, (str, int, float, bool)):
                problems.append(Problem("keys must be plain scalars", dotted_path(path), *_pos(file, key_node)))
                continue
            key = str(key) if not isinstance(key, str) else key
            if key in out and key in owned:
                first = src.keys[path + (key,)]
                problems.append(
                    Problem(f"duplicate key '{key}' (first at line {first.line})", dotted_path(path + (key,)), *_pos(file, key_node))
                )
                continue
            if index >= inherited:
                owned.add(key)
            src.keys[path + (key,)] = _mark(file, key_node)
            out[key] = _construct(value_node, file, path + (key,), src, problems)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, file, path + (i,), src, problems) for i, item in enumerate(node.value)]
    return _scalar(node)


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-3`` as a float as YAML 1.2 does (YAML 1.1 wants ``1.0e-3``)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_SCALAR_LOADER = Loader("")


def _scalar(node: yaml.Node) -> Any:
    return _SCALAR_LOADER.construct_object(node, deep=True)


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
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(f"YAML error: {exc}", "", file, 1, 1)]) from None
    if node is None:
        raise RecipeError([Problem("the recipe is empty", "", file, 1, 1)])
    src = Source({})
    problems: list[Problem] = []
    try:
        data = _construct(node, file, (), src, problems)
    except yaml.constructor.ConstructorError as exc:
        m = exc.problem_mark
        raise RecipeError([Problem(f"YAML error: {exc.problem}", "", file, m.line + 1, m.column + 1)]) from None
    if problems:
        raise RecipeError(problems)
    if not isinstance(data, dict):
        raise RecipeError([Problem("a recipe must be a mapping of sections (model, data, optim, trainer)", "", file, 1, 1)])
    src.data = data
    return src


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_source(path: str | Path) -> Source:
    """Load ``path`` and everything it ``extends``, deep-merged (mappings merge, lists are replaced)."""
    return _load(Path(path), stack=())


def _load(path: Path, stack: tuple[Path, ...], via: Problem | None = None) -> Source:
    shown = _display(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError([via or Problem(f"no such recipe file: {shown}", "", shown, 1, 1)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if via is not None:  # report it where the parent is named
            raise RecipeError([Problem(f"extends {shown}, which cannot be read: {reason}", via.path, via.file, via.line, via.col)]) from None
        raise RecipeError([Problem(f"cannot read recipe: {reason}", "", shown, 1, 1)]) from None
    src = parse_yaml(text, shown)
    parent_name = src.data.get("extends")
    if parent_name is None:
        src.data.pop("extends", None)
        return src
    if not isinstance(parent_name, str) or not parent_name.strip():
        raise RecipeError([src.problem(("extends",), "extends must be a path to another recipe (relative to this one)")])
    parent_path = (path.parent / parent_name).resolve()
    chain = stack + (path.resolve(),)
    if parent_path in chain:
        loop = " -> ".join(_display(p) for p in chain + (parent_path,))
        raise RecipeError([src.problem(("extends",), f"extends cycle: {loop}")])
    missing = src.problem(("extends",), f"extends a file that does not exist: {_display(parent_path)}")
    parent = _load(parent_path, chain, via=missing)
    # ``name`` and ``extends`` belong to each file: a child does not inherit its parent's name.
    parent.data.pop("name", None)
    del src.data["extends"]
    return merge(parent, src)


def merge(base: Source, top: Source) -> Source:
    """Deep-merge ``top`` over ``base``: mappings merge key by key, anything else replaces."""
    out = Source(copy.deepcopy(base.data), dict(base.values), dict(base.keys))

    def drop_below(path: Key) -> None:
        for table in (out.values, out.keys):
            for k in [k for k in table if k[: len(path)] == path and len(k) > len(path)]:
                del table[k]

    def visit(dst: dict, src: dict, path: Key) -> None:
        for key, value in src.items():
            p = path + (key,)
            if isinstance(value, dict) and isinstance(dst.get(key), dict) and not _retyped(dst[key], value):
                out.values[p] = top.values.get(p, out.values.get(p))
                out.keys[p] = top.keys.get(p, out.keys.get(p))
                visit(dst[key], value, p)
            else:
                drop_below(p)
                dst[key] = copy.deepcopy(value)
                for table, mine in ((out.values, top.values), (out.keys, top.keys)):
                    for k, m in mine.items():
                        if k[: len(p)] == p:
                            table[k] = m

    visit(out.data, top.data, ())
    return out


def _retyped(old: dict, new: dict) -> bool:
    """A component whose ``type`` changes is replaced, not merged: its old params may not apply."""
    return "type" in new and "type" in old and new["type"] != old["type"]


def apply_overrides(src: Source, overrides: list[str] | tuple[str, ...]) -> Source:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML) over ``src``."""
    problems: list[Problem] = []
    for text in overrides:
        label = f"--set {text}"
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem("an override must look like dotted.key=value", "", label, 1, 1))
            continue
        parts: list[Any] = [int(p) if p.isdigit() else p for p in key.split(".")]
        if any(p == "" for p in parts):
            problems.append(Problem("empty key in the dotted path", key, label, 1, 1))
            continue
        key = dotted_path(tuple(parts))
        if parts[0] == "extends":
            problems.append(Problem("extends cannot be overridden: edit the recipe or extend it", key, label, 1, 1))
            continue
        col = len(text) - len(raw) + 1
        try:
            value = yaml.load(raw, Loader=Loader) if raw.strip() else None  # noqa: S506 (a safe loader)
        except yaml.YAMLError as exc:
            problems.append(Problem(f"cannot parse value {raw!r}: {getattr(exc, 'problem', exc)}", key, label, 1, col))
            continue
        node: Any = src.data
        ok = True
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, list) and isinstance(part, int) and part < len(node):
                nxt = node[part]
            if nxt is None:
                if isinstance(node, dict):
                    nxt = node[part] = {}
                    created = tuple(parts[: i + 1])
                    src.values[created] = Mark(label, 1, 1)
                    src.keys[created] = Mark(label, 1, 1)
                else:
                    ok = False
            if not isinstance(nxt, (dict, list)):
                where = dotted_path(tuple(parts[: i + 1]))
                problems.append(Problem(f"cannot set {key}: {where} is not a mapping", key, label, 1, 1))
                ok = False
                break
            node = nxt
        if not ok:
            continue
        last = parts[-1]
        if isinstance(node, list):
            if not isinstance(last, int) or last >= len(node):
                problems.append(Problem(f"index {last} is out of range", key, label, 1, 1))
                continue
        if last == "type" and isinstance(node, dict) and node.get("type") not in (None, value):
            node.clear()  # a new component type starts from its own defaults (see _retyped)
            parent = tuple(parts[:-1])
            for table in (src.values, src.keys):
                for k in [k for k in table if k[: len(parent)] == parent and len(k) > len(parent)]:
                    del table[k]
        node[last] = value
        path = tuple(parts)
        for table in (src.values, src.keys):
            for k in [k for k in table if k[: len(path)] == path]:
                del table[k]
        src.values[path] = Mark(label, 1, col)
        src.keys[path] = Mark(label, 1, 1)
    if problems:
        raise RecipeError(problems)
    return src
