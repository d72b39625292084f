"""The checkpoints a command reads (``RUN_OR_CKPT`` and ``--checkpoint``), loaded and named on
standard error, so that the output can say what it scored."""

from __future__ import annotations

import argparse
import sys

from tfbuilder.errors import TfbuilderError
from tfbuilder.runs.checkpoints import CHOICES, Loaded, load_checkpoint

# The commands that decode text; a checkpoint with a sequence head labels texts instead.
DECODING = ("translate", "generate", "attention")


def load(args: argparse.Namespace, path: str | None = None) -> Loaded:
    """The checkpoint a command uses (of ``path``, default ``args.checkpoint``), named on standard
    error (the output says what it scored)."""

    loaded = load_checkpoint(path or args.checkpoint, checkpoint=args.which, device=getattr(args, "device", None))
    print(f"checkpoint: {loaded.describe()}", file=sys.stderr)
    if loaded.recipe.model.head is not None and args.command in DECODING:
        raise TfbuilderError(
            f"{args.command}: {loaded.describe()} has a sequence head (model.head: {loaded.recipe.model.head.type}): "
            "it labels texts; use tfbuilder predict"
        )
    return loaded


def load_all(args: argparse.Namespace) -> list[Loaded]:
    """The checkpoints of a command that takes several (an ensemble), each named on standard error."""

    if len(args.checkpoint) > 1 and args.which is not None and args.which not in CHOICES:
        raise TfbuilderError(
            f"--checkpoint {args.which} names one file, but {len(args.checkpoint)} checkpoints were given"
        )
    return [load(args, path) for path in args.checkpoint]
