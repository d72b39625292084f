"""The verbs that make runs: ``fit`` (train, or resume, through Lightning), ``prepare`` (tokenize a
recipe's data into its store) and ``average`` (the mean weights of a run's last checkpoints)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from tfbuilder.cli.arguments import EXIT_USAGE, add_set, writable_parent
from tfbuilder.data.prepare import prepare, summary_lines
from tfbuilder.runs.averaging import write_average
from tfbuilder.runs.checkpoints import RUN_DIR_ENV, read_checkpoint
from tfbuilder.spec.recipe import load_recipe, recipe_from_dict

if TYPE_CHECKING:
    from tfbuilder.cli.arguments import Subparsers


def add_fit(sub: Subparsers) -> None:
    f = sub.add_parser("fit", help="train a recipe (or resume a run) through Lightning")
    f.add_argument(
        "recipe", nargs="?", metavar="RECIPE", help="the recipe to train (not with --resume: a run keeps its recipe)"
    )
    f.add_argument("--resume", metavar="RUN_OR_CKPT", help="continue a run directory or checkpoint")
    f.add_argument(
        "--init-from", metavar="CHECKPOINT", help="start a new run from these weights (fresh optimizer and schedule)"
    )
    f.add_argument("--force", action="store_true", help="resume a run directory that was copied or moved")
    f.add_argument(
        "--run-dir",
        metavar="DIR",
        help="this run's directory: start the run there, or continue it from DIR's last checkpoint when it holds "
        "one, so a scheduler can run the same command again after a requeue or a crash (the environment "
        f"variable {RUN_DIR_ENV}=DIR does the same; not with --resume)",
    )
    add_set(f)
    f.set_defaults(run=cmd_fit)


def add_prepare(sub: Subparsers) -> None:
    pr = sub.add_parser("prepare", help="tokenize a recipe's data once into a store on disk (fit does it when needed)")
    pr.add_argument("recipe", metavar="RECIPE", help="a recipe file (YAML)")
    add_set(pr)
    pr.set_defaults(run=cmd_prepare)


def add_average(sub: Subparsers) -> None:
    av = sub.add_parser(
        "average", help="average the weights of a run's last N kept checkpoints (Vaswani et al. sec. 6.1)"
    )
    av.add_argument("run_dir", metavar="RUN_DIR", help="a run directory trained with trainer.keep_last")
    av.add_argument("--last", type=int, default=5, metavar="N", help="how many of the kept checkpoints (default 5)")
    av.add_argument(
        "--out", metavar="FILE", help="where to write (default RUN_DIR/checkpoints/averaged.ckpt; never overwritten)"
    )
    av.set_defaults(run=cmd_average)


def cmd_fit(args: argparse.Namespace) -> int:
    if (args.recipe is None) == (args.resume is None):
        print("fit: give a RECIPE, or --resume RUN_DIR_OR_CHECKPOINT", file=sys.stderr)
        return EXIT_USAGE
    if args.init_from and args.resume:
        print("fit: --init-from starts a new run from a RECIPE; --resume continues a run: give one", file=sys.stderr)
        return EXIT_USAGE
    if args.force and not args.resume:
        print("fit: --force applies to --resume", file=sys.stderr)
        return EXIT_USAGE
    if args.run_dir and args.resume:
        print(
            "fit: --run-dir starts or continues the run of a RECIPE; --resume continues a run: give one",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.resume:
        recipe = recipe_from_dict(read_checkpoint(args.resume)["tfbuilder"]["recipe"], args.overrides)
    else:
        recipe = load_recipe(args.recipe, args.overrides)  # fit runs the pre-flight itself
    from tfbuilder.train.fit import fit  # deferred: start-up time

    summary = fit(recipe, resume=args.resume, init_from=args.init_from, force=args.force, run_dir=args.run_dir)
    if summary is not None and _is_rank_zero():
        print("\n".join(summary.lines()))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    if recipe.data is None:
        print("prepare: the recipe has no data section", file=sys.stderr)
        return EXIT_USAGE
    prepared = prepare(recipe.data, model_vocab=recipe.model.vocab_size, say=print)
    print("\n".join(summary_lines(prepared)))
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    if args.out is not None:
        writable_parent(args.out, "--out")  # before the checkpoints are read
    out, paths = write_average(args.run_dir, last=args.last, out=args.out)
    print("averaged " + ", ".join(p.name for p in paths))
    print(f"wrote {out}")
    return 0


def _is_rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import rank_zero_only  # deferred: start-up time

    # Lightning sets `rank` on the function at import; its overloaded signature does not declare it.
    return rank_zero_only.rank == 0  # type: ignore[attr-defined]
