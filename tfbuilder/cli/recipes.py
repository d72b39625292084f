"""The verbs that read recipes and the registry, and train nothing: ``validate``, ``show``, ``diff``,
``components`` and ``schema``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import yaml
from pydantic.fields import FieldInfo

from tfbuilder import registry
from tfbuilder.atomic import write_new_text
from tfbuilder.cli.arguments import EXIT_USAGE, add_set, count, new_file
from tfbuilder.errors import RecipeError, TfbuilderError, printable
from tfbuilder.model.builder import build_model, count_parameters
from tfbuilder.model.module_tree import format_tree, kv_cache_per_token, tree
from tfbuilder.spec.diffing import differences, format_table
from tfbuilder.spec.recipe import json_schema, load_recipe
from tfbuilder.spec.stacks import LAYER_FAMILIES

if TYPE_CHECKING:  # the CLI imports the recipe schema (and torch) only in the commands that need them
    from tfbuilder.cli.arguments import Subparsers
    from tfbuilder.model.model import Model
    from tfbuilder.spec.recipe import Recipe


def add_validate(sub: Subparsers) -> None:
    v = sub.add_parser("validate", help="check recipes; print OK or every problem (exit 0 or 2)")
    v.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe files (YAML)")
    v.add_argument(
        "--no-data",
        dest="data",
        action="store_false",
        help="do not look at the data's files (a folder or tokenizer file on another machine)",
    )
    add_set(v)
    v.set_defaults(run=cmd_validate)


def add_show(sub: Subparsers) -> None:
    s = sub.add_parser("show", help="the resolved recipe, the module tree and parameter counts")
    s.add_argument("recipe", metavar="RECIPE", help="a recipe file (YAML)")
    s.add_argument("--depth", type=count, default=4, help="depth of the module tree (default 4)")
    add_set(s)
    s.set_defaults(run=cmd_show)


def add_diff(sub: Subparsers) -> None:
    df = sub.add_parser("diff", help="the resolved differences between two recipes, key by key")
    df.add_argument("a", metavar="A.yaml", help="the first recipe")
    df.add_argument("b", metavar="B.yaml", help="the second recipe")
    df.set_defaults(run=cmd_diff)


def add_components(sub: Subparsers) -> None:
    c = sub.add_parser("components", help="registered components with their params")
    c.add_argument("family", nargs="?", choices=registry.FAMILIES, help="only this family (default all)")
    c.set_defaults(run=cmd_components)


def add_schema(sub: Subparsers) -> None:
    j = sub.add_parser("schema", help="JSON Schema of recipes (for editors' YAML language servers)")
    j.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    j.set_defaults(run=cmd_schema)


def _check(path: str, overrides: list[str]) -> tuple[Recipe, Model]:
    """Load a recipe and build its model on the meta device (no memory, no time): all problems at once."""
    import torch

    recipe = load_recipe(path, overrides)
    with torch.device("meta"):
        model = build_model(recipe)
    return recipe, model


def preflight(path: str, overrides: list[str], *, data: bool = True) -> Recipe:
    """Load a recipe and run the pre-flight (the model builds, steps, fits this machine, its data's files
    are there unless ``data`` is false; see preflight.py)."""
    from tfbuilder.train.preflight import check  # deferred: start-up time

    recipe = load_recipe(path, overrides)
    check(recipe, data=data)
    return recipe


def cmd_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.recipes:
        try:
            preflight(path, args.overrides, data=args.data)
        except RecipeError as exc:
            failed = True
            print("\n".join(str(p) for p in exc.problems), file=sys.stderr)
            continue
        print(f"{printable(path)}: OK")
    return EXIT_USAGE if failed else 0


def cmd_show(args: argparse.Namespace) -> int:
    recipe, model = _check(args.recipe, args.overrides)
    print(f"# resolved recipe: {args.recipe}")
    print(yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=False).rstrip())
    print()
    print("# modules (distinct parameters; tied weights counted once)")
    print(format_tree(tree(model, max_depth=args.depth)))
    print()
    print(f"total parameters: {count_parameters(model):,}")
    cached = kv_cache_per_token(model)
    if cached is not None:
        print(
            f"KV cache per generated token (every decoder layer): {cached:,} numbers, "
            f"{cached * 2 / 1024:,.1f} KiB in bfloat16"
        )
    layers = _layer_lines(recipe)
    if layers:
        print()
        print("# layers (pattern and overrides)")
        print("\n".join(layers))
    if recipe.optim.optimizer == "muon":
        from tfbuilder.train.optimizers import describe_split  # deferred: start-up time

        print()
        print("# optimizers (optim.optimizer: muon)")
        print("\n".join(describe_split(model)))
    return 0


def _layer_lines(recipe: Recipe) -> list[str]:
    """Each stack with a pattern or overrides: runs of alike layers, and what each kind changes."""
    lines = []
    for part in ("encoder", "decoder"):
        stack = recipe.model.stack(part)
        if stack is None or not (stack.pattern or stack.overrides):
            continue
        labels = recipe.model.layer_kinds(part)
        runs, start = [], 0
        for i in range(1, len(labels) + 1):
            if i == len(labels) or labels[i] != labels[start]:
                span = str(start) if i - 1 == start else f"{start}-{i - 1}"
                runs.append(f"{span} {labels[start]}")
                start = i
        lines.append(f"{part}: " + ", ".join(runs))
        named = [(f"kind {name}", changes) for name, changes in stack.kinds.items()]
        named += [(f"layer {index}", changes) for index, changes in stack.overrides.items()]
        for label, changes in named:
            changed = [
                f"{family}.{key}={value}"
                for family in LAYER_FAMILIES
                for key, value in (getattr(changes, family) or {}).items()
            ]
            lines.append(f"  {label}: " + (", ".join(changed) or "(the stack's components)"))
    return lines


def cmd_diff(args: argparse.Namespace) -> int:
    problems = []
    recipes = []
    for path in (args.a, args.b):
        try:
            recipes.append(load_recipe(path))
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    rows = differences(*recipes)
    print(format_table(rows, args.a, args.b) if rows else "no differences")
    return 0


def _describe_field(name: str, field: FieldInfo) -> str:
    default = "required" if field.is_required() else f"default {field.get_default(call_default_factory=True)!r}"
    return f"      {name}: {default} - {field.description}"


def cmd_components(args: argparse.Namespace) -> int:
    families = [args.family] if args.family else list(registry.FAMILIES)
    for family in families:
        print(f"{family}:")
        for entry in registry.entries(family):
            print(f"  {entry.name}  ({entry.cls.__name__}, {entry.source})")
            if entry.doc:
                print(f"    {entry.doc}")
            for name, field in entry.params.model_fields.items():
                if name != "type":
                    print(_describe_field(name, field))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        new_file(args.output, "--output")
        if write_new_text(args.output, text, what="schema") is None:  # never replaces a file
            raise TfbuilderError(f"--output {args.output} is an existing file: not overwriting it; name a new file")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
