"""Reference pages of the documentation, generated from the code that defines what they describe.

``python -m tfbuilder.cli.reference`` writes three Markdown pages into ``docs/reference/``:
``recipe.md``      every recipe section and key (type, default, bounds, description), from the same
                   pydantic models that validate recipes and that ``tfbuilder schema`` exports;
``components.md``  every registered component family and type with its params and the first
                   paragraph of its docstring (the paper it comes from), from the registry;
``cli.md``         every ``tfbuilder`` command with every option and its help, from the argparse
                   parser of :mod:`tfbuilder.cli.commands`.

``python -m tfbuilder.cli.reference --check`` writes nothing and exits 1, naming the stale pages, when a
committed page differs from what the code generates now (the docs build and a test run it).
Output is deterministic: natural order where the code has one (fields, commands), sorted otherwise
(component types), no paths or addresses of this machine.
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tfbuilder import atomic, registry
from tfbuilder.cli import commands as cli
from tfbuilder.cli import package_map
from tfbuilder.cli.markdown import code, first_paragraph, number, prose, table, yaml_value
from tfbuilder.spec.recipe import Recipe
from tfbuilder.spec.recipe import _slot_family as recipe_slot_family  # the recipe module owns what a slot looks like

COMMAND = "python -m tfbuilder.cli.reference"
DEFAULT_DIR = Path("docs") / "reference"


def header(source: str) -> str:
    """The comment every generated page starts with: what made it, and how to remake it."""
    return (
        f"<!-- Generated from {source} by `{COMMAND}`: do not edit by hand. "
        f"Regenerate with `{COMMAND}`; `{COMMAND} --check` fails while this page is stale. -->\n"
    )


# --- field descriptions, shared by the recipe and components pages ----------------------------------


@dataclass(frozen=True)
class Links:
    """Where a type name links to: recipe sections (by model class) and component families."""

    sections: dict[type, tuple[str, ...]]
    components_page: str = ""

    def section(self, cls: type) -> str:
        path = self.sections.get(cls)
        return f"section [{code('.'.join(path))}](#{anchor(path)})" if path else cls.__name__

    def component(self, family: str) -> str:
        return f"[{family} component]({self.components_page}#{family})"


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, meta...]`` -> (X, meta)."""
    if get_origin(annotation) is Annotated:
        base, *meta = get_args(annotation)
        return base, meta
    return annotation, []


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) is Union or isinstance(annotation, types.UnionType)


def _slot_family(annotation: Any, metadata: Sequence[Any]) -> str | None:
    """The component family a field holds, if it is a component slot (see ``recipe.slot``)."""

    return recipe_slot_family((annotation, *metadata))


def type_name(annotation: Any, links: Links, metadata: Sequence[Any] = ()) -> str:
    """A field's type in the words a recipe uses: int, float, bool, string, null, literals, lists."""
    base, _ = _unwrap(annotation)
    if _is_union(base):  # before slots: `attention: Attention | None` is a component or null
        parts = [type_name(arg, links) for arg in get_args(base)]
        return " or ".join(dict.fromkeys(parts))
    family = _slot_family(annotation, metadata)
    if family is not None:
        return links.component(family)
    origin = get_origin(base)
    if origin is Literal:
        return " or ".join(code(yaml_value(v)) for v in get_args(base))
    if origin is tuple:
        return "[" + ", ".join(type_name(arg, links) for arg in get_args(base)) + "]"
    if origin is list:
        return "list of " + type_name(get_args(base)[0], links)
    if base is type(None):
        return "null"
    if isinstance(base, type) and issubclass(base, BaseModel):
        return links.section(base)
    names = {int: "int", float: "float", bool: "bool", str: "string"}
    return names.get(base, getattr(base, "__name__", str(base)))


_BOUNDS: tuple[tuple[type, str, str], ...] = (
    (annotated_types.Ge, "ge", "≥ {}"),
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Le, "le", "≤ {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.MinLen, "min_length", "length ≥ {}"),
    (annotated_types.MaxLen, "max_length", "length ≤ {}"),
)


def _constraints(metadata: Sequence[Any]) -> Iterator[str]:
    for item in metadata:
        for kind, attribute, template in _BOUNDS:
            if isinstance(item, kind):
                yield template.format(number(getattr(item, attribute)))
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            yield "pattern " + code(pattern)


def _nested_metadata(annotation: Any) -> Iterator[Any]:
    """Constraints written inside a union member, e.g. ``Annotated[int, Field(ge=1)] | Literal['auto']``."""
    base, meta = _unwrap(annotation)
    for item in meta:
        if isinstance(item, FieldInfo):
            yield from item.metadata
        else:
            yield item
    for arg in get_args(base) if _is_union(base) else ():
        yield from _nested_metadata(arg)


def bounds(field: FieldInfo) -> str:
    """The field's bounds (``≥ 1, ≤ 1,000``; a pattern), or empty."""
    found = list(_constraints(field.metadata)) + list(_constraints(list(_nested_metadata(field.annotation))))
    return ", ".join(dict.fromkeys(found))


def default(field: FieldInfo) -> str:
    """The field's default as a recipe would write it; a component default is its type name."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, registry.ComponentParams):
        return code(value.type)
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    return code(yaml_value(value))


def field_rows(model: type[BaseModel], links: Links, *, skip: Sequence[str] = ()) -> list[list[str]]:
    """One row per field of ``model``: key, type, default, bounds, description."""
    rows = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        rows.append(
            [
                code(name),
                type_name(field.annotation, links, field.metadata),
                default(field),
                bounds(field),
                prose(field.description or ""),
            ]
        )
    return rows


FIELD_HEAD = ("key", "type", "default", "bounds", "description")


# --- recipe.md ---------------------------------------------------------------------------------------


def _section_model(field: FieldInfo) -> type[BaseModel] | None:
    """The section model a field holds (``DataSection | None`` -> DataSection), if any."""
    if _slot_family(field.annotation, field.metadata) is not None:
        return None
    base, _ = _unwrap(field.annotation)
    for candidate in (base, *get_args(base)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def sections(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], type[BaseModel]]]:
    """Every recipe section, depth first in field order: ``((), Recipe), (('model',), ModelSection), ...``."""
    yield path, model
    for name, field in model.model_fields.items():
        nested = _section_model(field)
        if nested is not None:
            yield from sections(nested, (*path, name))


def anchor(path: tuple[str, ...]) -> str:
    return "-".join(path) if path else "top-level"


def slots(model: type[BaseModel] | None = None) -> dict[str, list[str]]:
    """Family -> the dotted recipe keys that hold a component of it."""

    found: dict[str, list[str]] = {family: [] for family in registry.FAMILIES}
    for path, section in sections(model or Recipe):
        for name, field in section.model_fields.items():
            family = _slot_family(field.annotation, field.metadata)
            if family is not None:
                found[family].append(".".join((*path, name)))
    return found


def recipe_page() -> str:
    """``docs/reference/recipe.md``: every section and key of a recipe."""

    walked = list(sections(Recipe))
    # A section reached by one path links there (StackSection is model.encoder, DecoderSection model.decoder).
    links = Links({cls: path for path, cls in reversed(walked)}, components_page="components.md")
    out = [
        header("the recipe schema (tfbuilder/spec/recipe.py, tfbuilder/spec/sections.py)"),
        "# Recipe reference\n",
        "Every section and key a recipe may hold, with its type, default, bounds and description. "
        "These are the models that validate recipes and that `tfbuilder schema` exports as a JSON Schema. "
        "Unknown keys are errors; a key left out takes its default. Component keys take a registered "
        "type, written `{type: NAME, ...params}` or just `NAME`; their params are in the "
        "[components reference](components.md). Rules between keys (e.g. `d_model` divisible by `heads`) "
        "and the pre-flight are checked by `tfbuilder validate`; see the [recipes guide](../recipes.md).\n",
    ]
    for path, cls in walked:
        title = ".".join(path) if path else "Top level"
        out.append(f"## {code(title) if path else title} {{ #{anchor(path)} }}\n")
        out.append(prose(first_paragraph(cls.__doc__)) + "\n")
        out.append(table(FIELD_HEAD, field_rows(cls, links)))
    return "\n".join(out)


# --- components.md -----------------------------------------------------------------------------------


def components_page() -> str:
    """``docs/reference/components.md``: every registered family and type with its params."""
    links = Links({}, components_page="")
    where = slots()
    out = [
        header("the component registry (tfbuilder/registry.py, tfbuilder/model/components/)"),
        "# Components reference\n",
        "Every registered component, by family, with the params a recipe may set. A component is "
        "written `{type: NAME, ...params}` or just `NAME` (all params at their defaults). This page "
        "lists what is registered when it is generated: the built-in components and any plugin "
        "package installed at the time (see [adding a component](../components.md)). "
        "`tfbuilder components [FAMILY]` prints the same in a terminal.\n",
    ]
    for family in registry.FAMILIES:
        entries = registry.entries(family)
        out.append(f"## {family} {{ #{family} }}\n")
        keys = ", ".join(code(k) for k in where[family])
        out.append(f"Types: {', '.join(code(e.name) for e in entries)}. Set at: {keys}.\n")
        for entry in entries:
            out.append(f"### {family}: {entry.name} {{ #{family}-{entry.name} }}\n")
            where_defined = f"{code(entry.cls.__name__)} in {code(entry.source)}."
            out.append(f"{where_defined} {prose(first_paragraph(entry.cls.__doc__))}\n")
            out.append(f"In a recipe: {code(f'{family}: {{type: {entry.name}}}')}\n")
            rows = field_rows(entry.params, links, skip=("type",))
            out.append(table(FIELD_HEAD, rows) if rows else "No params.\n")
    return "\n".join(out)


# --- cli.md ------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of every subcommand, in the order the parser defines them.

    argparse keeps subcommands in private attributes; they have been stable since Python 3.2."""
    found = []
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}  # noqa: SLF001
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    """``tfbuilder NAME ARGS...``, written out here rather than by argparse (whose wrapping depends on
    the terminal width and whose layout changes between Python versions)."""
    parts = [f"tfbuilder {name}"]
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        if not action.option_strings:
            meta = _metavar(action)
            shapes: dict[int | str | None, str] = {"+": f"{meta} [{meta} ...]", "?": f"[{meta}]", "*": f"[{meta} ...]"}
            parts.append(shapes.get(action.nargs, meta))
            continue
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        text = f"{flag} {_metavar(action)}" if _takes_value(action) else flag
        if action.nargs == "+":
            text += " ..."
        parts.append(text if action.required else f"[{text}]")
    return " ".join(parts)


def _option_default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # noqa: SLF001
        return ""
    value = action.default
    if value is None or value == [] or value is argparse.SUPPRESS:
        return ""
    return code(str(value))


def _option_value(action: argparse.Action) -> str:
    if not _takes_value(action):
        return "flag"
    if action.choices is not None:
        return " or ".join(code(str(c)) for c in action.choices)
    value = "" if not action.option_strings else code(_metavar(action))
    if action.type is not None:  # cli.arguments names its checking types for argparse's messages
        value += f" ({prose(getattr(action.type, '__name__', str(action.type)))})"
    if action.nargs == "+":
        value += ", one or more"
    elif action.nargs == "?":
        value += ", optional"
    if not action.option_strings:
        value = "positional" + value
    if isinstance(action, argparse._AppendAction):  # noqa: SLF001
        value += ", repeatable"
    return value


def option_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    """One row per argument (positionals first, as argparse defines them), without ``--help``."""
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]  # noqa: SLF001
    ordered = [a for a in actions if not a.option_strings] + [a for a in actions if a.option_strings]
    rows = []
    for action in ordered:
        name = ", ".join(code(s) for s in action.option_strings) if action.option_strings else code(_metavar(action))
        if action.required and action.option_strings:
            name += " (required)"
        rows.append([name, _option_value(action), _option_default(action), prose(action.help or "")])
    return rows


def cli_page(make_parser: Callable[[], argparse.ArgumentParser] | None = None) -> str:
    """``docs/reference/cli.md``: every command and option of ``tfbuilder``."""
    if make_parser is None:
        make_parser = cli.parser
    parser = make_parser()
    commands = _subcommands(parser)
    out = [
        header("the argument parser (tfbuilder/cli/commands.py)"),
        "# Command-line reference\n",
        prose(parser.description or "") + " Every command takes `-h`/`--help`. "
        "The [commands guide](../commands.md) explains what each one does, exit statuses included.\n",
        table(("command", "what it does"), [[f"[{code('tfbuilder ' + n)}](#{n})", prose(h)] for n, h, _ in commands]),
    ]
    for name, help_text, sub in commands:
        out.append(f"## tfbuilder {name} {{ #{name} }}\n")
        out.append(prose(help_text) + "\n")
        out.append("```text\n" + synopsis(name, sub) + "\n```\n")
        rows = option_rows(sub)
        out.append(table(("argument", "value", "default", "help"), rows) if rows else "No arguments.\n")
    return "\n".join(out)


# --- writing and checking ----------------------------------------------------------------------------


def pages() -> dict[str, str]:
    """File name -> content of every generated page."""
    return {
        "cli.md": cli_page(),
        "components.md": components_page(),
        "recipe.md": recipe_page(),
        "packages.md": package_map.page(header("pyproject.toml's layers contract and the modules' docstrings")),
    }


def stale(directory: Path, generated: dict[str, str] | None = None) -> list[str]:
    """The pages in ``directory`` that are missing or differ from what the code generates now."""
    generated = pages() if generated is None else generated
    found = []
    for name, text in generated.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            found.append(name)
    return found


def write(directory: Path) -> list[str]:
    """Write the pages that changed into ``directory``; returns their names."""
    generated = pages()
    changed = stale(directory, generated)
    directory.mkdir(exist_ok=True)
    for name in changed:
        atomic.write_text(directory / name, generated[name], what="reference page")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfbuilder.cli.reference [--check] [--out DIR]``: 0 done or current, 1 stale, 2 no such docs."""
    p = argparse.ArgumentParser(prog=COMMAND, description="Generate (or check) the reference pages of the docs.")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the pages that are stale")
    p.add_argument(
        "--out", type=Path, default=DEFAULT_DIR, metavar="DIR", help=f"the pages' directory (default {DEFAULT_DIR})"
    )
    args = p.parse_args(argv)
    directory: Path = args.out
    if not directory.parent.is_dir():
        message = f"{COMMAND}: no directory {directory.parent}: run from the repository root, or give --out"
        print(message, file=sys.stderr)
        return 2
    if args.check:
        found = stale(directory)
        if found:
            names = ", ".join(str(directory / n) for n in found)
            print(f"stale reference pages: {names}; regenerate them with `{COMMAND}`", file=sys.stderr)
            return 1
        print(f"{directory}: reference pages are current")
        return 0
    changed = write(directory)
    for name in changed:
        print(f"wrote {directory / name}")
    if not changed:
        print(f"{directory}: reference pages are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
