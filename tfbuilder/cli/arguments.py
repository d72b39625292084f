"""What the commands' arguments may hold: argparse value types with readable messages, the options
several commands share (``--set``, ``--device``, ``--checkpoint``, decoding rules and sampling), and
the checks of file and directory arguments made before any work starts."""

from __future__ import annotations

import argparse
import math
import os
from typing import TYPE_CHECKING

from tfbuilder.errors import TfbuilderError
from tfbuilder.streams import describe

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]  # what add_subparsers returns

EXIT_USAGE = 2  # a bad command line, recipe or argument: argparse's own status for usage errors
MAX_ALPHA = 10.0  # GNMT tunes alpha in [0, 1]; far beyond, ((5 + |y|) / 6) ** alpha only overflows


# --- value types: argparse says "invalid a positive integer value: 'x'" (see the names below) ----------


MAX_ARGUMENT = 2**31 - 1  # any count on the command line (a batch, a budget): within torch's int32 sizes
MAX_SEEDS = 1_000  # a sweep's seeds per recipe (each seed is a training run; ablations use 3 to 10)
MAX_BEAM = 1_000  # beams and n-best lists (each hypothesis costs a decoder row per step)


def positive_int(text: str, most: int = MAX_ARGUMENT) -> int:
    value = int(text)
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be between 1 and {most:,}, got {value}")
    return value


def seeds(text: str) -> int:
    return positive_int(text, MAX_SEEDS)


def beam(text: str) -> int:
    return positive_int(text, MAX_BEAM)


def count(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1,000,000, got {value}")
    return value


def finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def temperature(text: str) -> float:
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (greedy) or more, got {text}")
    return value


def alpha(text: str) -> float:
    value = finite(text)
    if not 0 <= value <= MAX_ALPHA:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_ALPHA:g}, got {text}")
    return value


def probability(text: str) -> float:
    value = finite(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^63), got {value}")
    return value


for _f, _name in (
    (positive_int, "a positive integer"),
    (seeds, f"an integer from 1 to {MAX_SEEDS:,}"),
    (beam, f"an integer from 1 to {MAX_BEAM:,}"),
    (count, "an integer"),
    (finite, "a number"),
    (temperature, "a number"),
    (alpha, "a number"),
    (probability, "a number"),
    (seed, "an integer"),
):
    _f.__name__ = _name  # argparse says "invalid a positive integer value: 'x'"


# --- options several commands share --------------------------------------------------------------


def add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. --set model.encoder.layers=2 (value parsed as YAML)",
    )


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        metavar="DEVICE",
        help="where the model runs: cpu, cuda, cuda:N or mps (default: a GPU when present, else the CPU)",
    )


def add_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--unk-penalty",
        type=finite,
        default=0.0,
        metavar="X",
        help="take X from the log-probability of <unk> at every step (default 0; negative favours it)",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=count,
        default=0,
        metavar="N",
        dest="no_repeat_ngram",
        help="no N-gram occurs twice in an output (default 0: off)",
    )


def add_checkpoints(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "checkpoint",
        metavar="RUN_OR_CKPT",
        nargs="+",
        help=f"a run directory or a checkpoint file; several {what} as an ensemble "
        "(the mean of their probabilities; one vocabulary)",
    )


def add_sampling(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument(
        "--temperature",
        type=temperature,
        default=1.0,
        help=f"softmax temperature of {what} (default 1; 0 always takes the most likely token)",
    )
    p.add_argument(
        "--top-k",
        type=positive_int,
        metavar="K",
        help=f"{what} draws from the K most likely tokens only (default: all)",
    )
    p.add_argument(
        "--top-p",
        type=probability,
        metavar="P",
        help=f"nucleus sampling: {what} draws from the most likely tokens holding this share of probability, "
        "in (0, 1] (default 1)",
    )
    p.add_argument(
        "--seed", type=seed, default=0, help="seed of the random draws (default 0: the same output each run)"
    )


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        dest="which",
        metavar="last|best|averaged|PATH",
        help="which checkpoint of a run directory (default best), or a checkpoint file",
    )


def add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=["32", "bf16"], default="32", help="decode in float32 (default) or bfloat16")


def add_alpha(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--alpha",
        type=alpha,
        default=0.6,
        help="length penalty exponent of beam search, 0 to 10 (default 0.6, the paper's)",
    )


# --- file and directory arguments, checked before a checkpoint is loaded or a run starts -------------


def readable_file(path: str, flag: str) -> None:
    """``path`` names an existing file that is not a directory (a FIFO is fine: it streams)."""
    kind = describe(path)
    if kind == "missing":
        raise TfbuilderError(f"{flag} {path}: no such file")
    if kind == "a folder":
        raise TfbuilderError(f"{flag} {path} is a directory, not a file")
    if kind not in ("a regular file", "a FIFO", "a character device"):  # /dev/stdin is a device
        raise TfbuilderError(f"{flag} {path} is {kind}, not a file")
    if not os.access(path, os.R_OK):
        raise TfbuilderError(f"{flag} {path}: not readable")


def new_file(path: str, flag: str) -> None:
    """``path`` can be created: it does not exist and its directory does (nothing is overwritten)."""
    if os.path.lexists(path):
        what = "a directory" if os.path.isdir(path) else "an existing file"
        raise TfbuilderError(f"{flag} {path} is {what}: not overwriting it; name a new file")
    writable_parent(path, flag)


def writable_parent(path: str, flag: str) -> None:
    """The folder ``path`` would be written in exists, is a folder and can be written."""
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        above = "is a file, not a directory" if os.path.exists(parent) else "does not exist"
        raise TfbuilderError(f"{flag} {path}: {parent} {above}")
    if not os.access(parent, os.W_OK | os.X_OK):  # read-only file system or folder (root too: EROFS)
        raise TfbuilderError(f"{flag} {path}: {parent} is not writable")


def directory_arg(path: str, flag: str) -> None:
    """``path`` is a directory or can become one: neither it nor a folder above it is a file, and the
    nearest existing folder can be written."""
    if "\0" in path:
        raise TfbuilderError(f"{flag} {path!r}: a path cannot hold a NUL byte")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise TfbuilderError(f"{flag} {path} is a file, not a directory")
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise TfbuilderError(f"{flag} {path}: {here} is a file, not a directory")
    if not os.access(here, os.W_OK | os.X_OK):
        raise TfbuilderError(f"{flag} {path}: {here} is not writable")
