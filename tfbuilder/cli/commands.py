"""The ``tfbuilder`` command: the parser that gathers every verb, and :func:`main`, which runs one and
turns errors into messages and exit statuses (no traceback). The verbs live by group, each module
adding its own subparsers and owning its handlers:

``recipes``     validate, show, diff, components, schema: read recipes and the registry, train nothing
``training``    fit, prepare, average: make runs
``decoding``    translate, generate, attention: decode with a checkpoint
``scoring``     test, predict: score or label with a checkpoint
``sweeps``      sweep, compare: many runs and their report
``interop``     import-hf, export: Hugging Face, safetensors and ONNX

Parsing, calling and printing only: no model logic here."""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tfbuilder import plugins
from tfbuilder.cli import decoding, interop, recipes, scoring, sweeps, training
from tfbuilder.cli.arguments import EXIT_USAGE
from tfbuilder.errors import RecipeError, TfbuilderError, printable
from tfbuilder.runs.checkpoints import Interrupted
from tfbuilder.version import __version__

if TYPE_CHECKING:
    from tfbuilder.cli.arguments import Subparsers

# The verbs in the order ``tfbuilder --help`` and docs/reference/cli.md have always listed them
# (tests/golden/api_surface.txt holds it). It interleaves the groups, so it is kept here, one adder
# per verb, rather than in one add-everything function per group.
VERBS: tuple[Callable[[Subparsers], None], ...] = (
    recipes.add_validate,
    recipes.add_show,
    training.add_fit,
    training.add_prepare,
    training.add_average,
    decoding.add_translate,
    decoding.add_generate,
    scoring.add_predict,
    scoring.add_test,
    recipes.add_diff,
    recipes.add_components,
    sweeps.add_sweep,
    sweeps.add_compare,
    decoding.add_attention,
    interop.add_import_hf,
    interop.add_export,
    recipes.add_schema,
)


def version_line() -> str:
    """``tfbuilder 0.1.0 (torch 2.13.0, lightning 2.6.0, Python 3.11.9)``, without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    python = sys.version.split()[0]
    return f"tfbuilder {__version__} (torch {installed('torch')}, lightning {installed('lightning')}, Python {python})"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tfbuilder", description="Declarative transformers from YAML recipes.")
    p.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="the versions of tfbuilder, torch and lightning, and exit",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in VERBS:
        add(sub)
    for command in sub.choices.values():  # every command: before a recipe or a checkpoint is read
        command.add_argument(
            "--plugins",
            action="append",
            default=[],
            metavar="FILE_OR_MODULE",
            help=(
                "import a Python file or module that registers components first (repeatable; recorded in "
                "checkpoints); this runs the file's code: pass only files you trust"
            ),
        )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv  # the command as typed (a sweep's report quotes it)
    args.main = main  # what a launched sweep's jobs run (tfbuilder.use.launch.Entry)
    try:
        if args.plugins:
            plugins.load(args.plugins)
        code = args.run(args)
        sys.stdout.flush()  # a full or closed standard output is an error here, not at exit
        return code
    except RecipeError as exc:
        print("\n".join(str(p) for p in exc.problems), file=sys.stderr)
        return EXIT_USAGE
    except TfbuilderError as exc:
        if isinstance(exc, Interrupted):  # not an error: what was kept, and how to go on
            again = f"Start again with: tfbuilder {shlex.join(argv)}"  # the command as typed
            print(printable(str(exc).replace(Interrupted.AGAIN, again)), file=sys.stderr)
            return exc.exit_code
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if not _stdout_failed(exc):
            raise
        print(f"error: cannot write to standard output: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


def _stdout_failed(exc: OSError) -> bool:
    """Whether ``exc`` is standard output failing (a full disk, /dev/full, a closed descriptor); if
    so, standard output becomes /dev/null so that the exit does not fail again."""
    if exc.filename is not None or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF):
        return False
    try:
        os.write(sys.stdout.fileno(), b"\n")  # only on this error path: is it standard output that fails?
        return False
    except (OSError, ValueError):
        pass
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return True


if __name__ == "__main__":
    sys.exit(main())
