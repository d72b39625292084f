"""The ``tfbuilder`` command: parses arguments, calls the API, prints. No model logic here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import yaml

from . import registry
from .errors import RecipeError, TfbuilderError

EXIT_USAGE = 2


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. --set model.encoder.layers=2 (value parsed as YAML)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tfbuilder", description="Declarative transformers from YAML recipes.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check recipes; print OK or every problem (exit 0 or 2)")
    v.add_argument("recipes", nargs="+", metavar="RECIPE")
    _add_set(v)
    v.set_defaults(run=cmd_validate)

    s = sub.add_parser("show", help="the resolved recipe, the module tree and parameter counts")
    s.add_argument("recipe", metavar="RECIPE")
    s.add_argument("--depth", type=int, default=4, help="depth of the module tree (default 4)")
    _add_set(s)
    s.set_defaults(run=cmd_show)

    f = sub.add_parser("fit", help="train a recipe (or resume a run) through Lightning")
    f.add_argument("recipe", nargs="?", metavar="RECIPE")
    f.add_argument("--resume", metavar="RUN_OR_CKPT", help="continue a run directory or checkpoint")
    _add_set(f)
    f.set_defaults(run=cmd_fit)

    c = sub.add_parser("components", help="registered components with their params")
    c.add_argument("family", nargs="?", choices=registry.FAMILIES)
    c.set_defaults(run=cmd_components)

    j = sub.add_parser("schema", help="JSON Schema of recipes (for editors' YAML language servers)")
    j.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    j.set_defaults(run=cmd_schema)
    return p


def _check(path: str, overrides: Sequence[str]):
    """Load a recipe and build its model on the meta device (no memory, no time): all problems at once."""
    import torch

    from .builder import build_model
    from .recipe import load_recipe

    recipe = load_recipe(path, overrides)
    with torch.device("meta"):
        model = build_model(recipe)
    return recipe, model


def cmd_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.recipes:
        try:
            _check(path, args.overrides)
        except RecipeError as exc:
            failed = True
            print("\n".join(str(p) for p in exc.problems), file=sys.stderr)
            continue
        print(f"{path}: OK")
    return EXIT_USAGE if failed else 0


def cmd_show(args: argparse.Namespace) -> int:
    from .builder import count_parameters
    from .summary import format_tree, tree

    recipe, model = _check(args.recipe, args.overrides)
    print(f"# resolved recipe: {args.recipe}")
    print(yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=False).rstrip())
    print()
    print("# modules (distinct parameters; tied weights counted once)")
    print(format_tree(tree(model, max_depth=args.depth)))
    print()
    print(f"total parameters: {count_parameters(model):,}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    if (args.recipe is None) == (args.resume is None):
        print("fit: give a RECIPE, or --resume RUN_DIR_OR_CHECKPOINT", file=sys.stderr)
        return EXIT_USAGE
    if args.resume:
        from .recipe import recipe_from_dict
        from .runs import read_checkpoint

        recipe = recipe_from_dict(read_checkpoint(args.resume)["tfbuilder"]["recipe"], args.overrides)
    else:
        recipe, _ = _check(args.recipe, args.overrides)
    from .training import fit

    summary = fit(recipe, resume=args.resume)
    if summary is not None and _is_rank_zero():
        print("\n".join(summary.lines()))
    return 0


def _is_rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank == 0


def _describe_field(name: str, field) -> str:
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
    from .recipe import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except RecipeError as exc:
        print("\n".join(str(p) for p in exc.problems), file=sys.stderr)
        return EXIT_USAGE
    except TfbuilderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
