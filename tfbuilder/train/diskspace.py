"""Free space for a run's checkpoints: checked before training, and a full disk named (no Lightning here).

A checkpoint holds the weights (4 bytes a parameter) and Adam's two moments (8 more), plus its
recipe, vocabulary and archive entries (the buffers, position tables and masks, are not saved). At the moment
one is written a run holds up to ``keep_last`` kept checkpoints, a ``best.ckpt`` older than them,
and the one being written.
"""

from __future__ import annotations

import errno
from pathlib import Path
from shutil import disk_usage

from tfbuilder.errors import TfbuilderError
from tfbuilder.model.sizing import count_parameters
from tfbuilder.runs.checkpoints import display_path
from tfbuilder.spec.recipe import Recipe

BYTES_PER_PARAMETER = 12  # fp32 weights + Adam's exp_avg and exp_avg_sq
OVERHEAD = 64 * 1024  # recipe, vocabulary, optimizer and loop state, archive entries
FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(TfbuilderError):
    """Not enough free space for a run's checkpoints (exit 2): nothing written is lost."""


def checkpoint_bytes(recipe: Recipe) -> int:
    """About how many bytes one checkpoint of ``recipe`` takes (counted on the meta device)."""

    return BYTES_PER_PARAMETER * count_parameters(recipe) + OVERHEAD


def free_bytes(path: Path) -> int:
    """Free bytes of the file system holding ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return disk_usage(path).free


def size(n: float) -> str:
    """1.2 MB, 340 kB, 12 B: decimal units, as disk tools show them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def check_free(recipe: Recipe, run_dir: Path, *, resumed: bool) -> None:
    """Refuse to start when the run's checkpoints cannot fit where they go."""
    each = checkpoint_bytes(recipe)
    keep = recipe.trainer.keep_last
    # A resumed run already holds its kept checkpoints: it needs room for the one being written
    # and a best.ckpt older than the kept ones.
    count, why = (
        (2, "one being written and a best.ckpt")
        if resumed
        else (keep + 2, f"keep_last {keep}, a best.ckpt and one being written")
    )
    need, free = count * each, free_bytes(run_dir)
    if free < need:
        raise DiskFull(
            f"not enough free space for the checkpoints in {display_path(run_dir)}: {size(need)} needed "
            f"({count} checkpoints at once: {why}; about {size(each)} each), {size(free)} free. "
            "Free some space, lower trainer.keep_last, or set trainer.output to another disk"
        )


def full_disk_message(folder: Path, what: str, each: int | None) -> str:
    """The first half of a mid-run message: which disk filled, what was being written (and about how
    large it is, when known), what is free."""
    needed = f"about {size(each)} needed, " if each is not None else ""
    return (
        f"the disk holding {display_path(folder)} is full (No space left on device): writing {what} failed "
        f"({needed}{size(free_bytes(folder))} free); no part of it was written (an earlier version stays whole)."
    )
