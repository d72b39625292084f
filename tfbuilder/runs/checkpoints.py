"""Run directories and checkpoints (no Lightning here: a checkpoint loads without it).

    <trainer.output>/<recipe name>/version_<n>/
        recipe.yaml        the resolved recipe
        tfbuilder-vocab.json  the vocabulary; tokenizer.json (or tokenizer.model) the same for other tools
                           (data/vocab_files.py)
        metrics.csv        always; TensorBoard, W&B and MLflow beside it (loggers.py; loggers.json says where)
        checkpoints/last.ckpt   the latest validated state (written at every validation)
        checkpoints/best.ckpt   the best by trainer.monitor
        checkpoints/step-<n>.ckpt  the trainer.keep_last most recent validations (for averaging)
        checkpoints/averaged.ckpt  written by ``tfbuilder average``
        summary.json       written when training ends (with the run's history across resumes)
        test-<split>-<checkpoint>[-beam<N>][-bf16].json   scores written by ``tfbuilder test`` and sweeps
        fit.lock           who is training here (held with flock while a fit runs)
        abandoned/from-step-<n>/   what a resume from step n moved aside (rewind.py): later checkpoints, metrics rows
        metrics.interrupted-<k>.csv  what attempt k logged, when a sweep started a run over before its first checkpoint

Nothing in a run directory is deleted or replaced by a later fit: see docs/runs.md.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from tfbuilder.atomic import write_text
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.pretrained import PretrainedTokenizer
from tfbuilder.data.tokenizers import BPETokenizer, HFTokenizer
from tfbuilder.devices import resolve
from tfbuilder.errors import DataError, RecipeError, TfbuilderError
from tfbuilder.model.builder import build_model
from tfbuilder.model.model import Model
from tfbuilder.model.sizing import check_size, count_parameters
from tfbuilder.registry import missing
from tfbuilder.runs import joblock
from tfbuilder.runs.archive import ArchiveError, check_archive
from tfbuilder.runs.sharded import ShardedError, is_sharded, read_sharded
from tfbuilder.spec.recipe import Recipe, recipe_from_dict
from tfbuilder.specials import OWN, SpecialIds
from tfbuilder.streams import open_own

RUN_DIR_ENV = "TFBUILDER_RUN_DIR"  # set by rank 0 so that the other ranks of a job share its run directory


class CheckpointError(TfbuilderError):
    """A checkpoint is missing, damaged, or not a tfbuilder checkpoint."""


class Interrupted(TfbuilderError):
    """Ctrl-C (exit 130) or SIGTERM (exit 143) stopped a fit; the message says what was kept. Not an error."""

    AGAIN = "Run the same command again to start"  # the end of a message when nothing was kept

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class RunDirError(TfbuilderError):
    """A run directory cannot be created or written."""


def new_run_dir(output: str | Path, name: str) -> Path:
    """Create ``<output>/<name>/version_<n>`` with the next free n; an existing run is never reused."""
    base = Path(output) / name
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run directory under {base}: {exc.strerror or exc}") from None
    if not os.access(base, os.W_OK):
        raise RunDirError(f"run directory {base} is not writable")
    taken = [int(p.name.split("_", 1)[1]) for p in base.glob("version_*") if p.name.split("_", 1)[1].isdigit()]
    version = max(taken, default=-1) + 1
    while True:
        path = base / f"version_{version}"
        try:
            path.mkdir()  # atomic: two runs starting together get different versions
            return path
        except FileExistsError:
            version += 1
        except OSError as exc:
            raise RunDirError(f"cannot create {path}: {exc.strerror or exc}") from None


RUN_MARKS = ("recipe.yaml", "fit.lock")  # a directory holding either was made by a fit


def is_empty(directory: Path) -> bool:
    """Whether ``directory`` holds nothing (an ``OSError`` when it cannot be listed)."""
    return next(directory.iterdir(), None) is None


def check_foreign(run_dir: Path) -> None:
    """Refuse to train into ``run_dir`` when it is a file, or a non-empty folder tfbuilder did not make
    (no recipe.yaml, no fit.lock): its files would be replaced."""
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        raise RunDirError(f"run directory {display_path(run_dir)} is not a directory")
    if not run_dir.is_dir() or any((run_dir / mark).exists() for mark in RUN_MARKS):
        return
    try:
        empty = is_empty(run_dir)
    except OSError as exc:
        raise RunDirError(f"cannot read run directory {display_path(run_dir)}: {exc.strerror or exc}") from None
    if not empty:
        raise RunDirError(
            f"{display_path(run_dir)} is not empty and is not a tfbuilder run directory (no recipe.yaml): "
            "not training into it; name a new or empty directory"
        )


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file or sharded checkpoint folder, or a run directory's ``checkpoints/last.ckpt``."""
    path = Path(path)
    if path.is_dir() and not is_sharded(path):
        for candidate in (path / "checkpoints" / "last.ckpt", path / "last.ckpt"):
            if present(candidate):
                return candidate
        raise CheckpointError(f"{path} has no checkpoints/last.ckpt: is it a tfbuilder run directory?")
    if not path.exists():
        raise CheckpointError(f"no such checkpoint: {path}")
    return path


def read_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint's raw dict with ``weights_only=True``; clear errors for anything else."""

    path = find_checkpoint(path)
    if is_sharded(path):  # a folder written under trainer.strategy: fsdp
        data = _read_sharded(path)
    else:
        data = _read_file(path)
    return _checked(path, data)


def present(path: Path) -> bool:
    """Whether a checkpoint is at ``path``: a file, or a sharded checkpoint's folder."""
    return path.is_file() or is_sharded(path)


def _read_sharded(path: Path) -> object:
    try:
        return read_sharded(path)
    except ShardedError as exc:
        raise CheckpointError(str(exc)) from None
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path}: its meta.pt holds objects tfbuilder does not load: not a tfbuilder checkpoint"
        ) from None
    except Exception as exc:  # noqa: BLE001 - damaged shards fail in many ways
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read checkpoint {path}: damaged ({first})") from None


def _read_file(path: Path) -> object:
    try:
        check_archive(path)  # a regular file, an archive of stored entries whose checksums match
    except ArchiveError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's message advises weights_only=False, which would run whatever the file holds: never relay it.
        raise CheckpointError(
            f"{path} holds objects tfbuilder does not load (a checkpoint holds only tensors and plain data): "
            "not a tfbuilder checkpoint, or one made by untrusted code"
        ) from None
    except Exception as exc:  # noqa: BLE001 - unpickling damaged data fails in many ways (IndexError, KeyError, ...)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read checkpoint {path}: damaged ({first})") from None
    return data


def _checked(path: Path, data: object) -> dict:
    if not isinstance(data, dict) or "tfbuilder" not in data or "state_dict" not in data:
        raise CheckpointError(f"{path} is not a tfbuilder checkpoint")
    meta = data["tfbuilder"]
    if not isinstance(meta, dict) or not isinstance(meta.get("recipe"), dict) or not isinstance(meta.get("vocab"), str):
        raise CheckpointError(f"{path}: damaged checkpoint: its recipe or vocabulary is missing")
    if not isinstance(data["state_dict"], dict) or not all(
        isinstance(v, torch.Tensor) for v in data["state_dict"].values()
    ):
        raise CheckpointError(f"{path}: damaged checkpoint: its weights are not a mapping of tensors")

    records = meta.get("components") or []
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and all(isinstance(v, (str, type(None))) for v in r.values()) for r in records
    ):
        raise CheckpointError(f"{path}: damaged checkpoint: its component records are not a list of names")
    absent = missing(records)
    if absent:
        raise CheckpointError(f"{path}: the model needs components this installation lacks: " + "; ".join(absent))
    return data


@dataclass
class Loaded:
    """What a checkpoint rebuilds: the model (eval mode, with its special ids as ``model.specials``),
    its recipe and its vocabulary."""

    model: Model
    recipe: Recipe
    vocab: Vocab
    path: Path
    step: int

    def describe(self) -> str:
        """``runs/x/checkpoints/best.ckpt (step 1,200)``: which checkpoint this is."""
        return f"{display_path(self.path)} (step {self.step:,})"


def load_checkpoint(
    path: str | Path, *, checkpoint: str | None = None, device: str | torch.device | None = None
) -> Loaded:
    """Rebuild a ready model from a checkpoint alone (its recipe, tokenizer and special ids travel
    inside it), on ``device`` (``None``: a GPU when present, see :func:`tfbuilder.devices.default_device`).

    ``path`` is a checkpoint file or a run directory; of a run directory, the checkpoint every command
    uses (:func:`choose_checkpoint`): ``best.ckpt`` (``last.ckpt`` when the run never kept a best),
    or ``checkpoint`` = ``"last"``, ``"best"``, ``"averaged"`` or a file. Which one was loaded is
    logged (logger ``tfbuilder``) and kept as :attr:`Loaded.path`."""

    ckpt_path = choose_checkpoint(path, checkpoint)
    data = read_checkpoint(ckpt_path)
    model, recipe, vocab = _rebuild(data["tfbuilder"], data, ckpt_path)
    state = finite_weights(data, ckpt_path)
    fits(model, state, source=ckpt_path)  # names each missing, unexpected or misshapen parameter
    model.load_state_dict(state)
    step = data.get("global_step", 0)
    model.to(resolve(device))  # in place, as eval()
    model.eval()
    loaded = Loaded(model, recipe, vocab, ckpt_path, step if isinstance(step, int) else 0)
    logging.getLogger("tfbuilder").info("loaded %s", loaded.describe())
    return loaded


def _rebuild(meta: dict, data: dict, ckpt_path: Path) -> tuple[Model, Recipe, Vocab]:
    """The model (its special ids set, weights not loaded), recipe and vocabulary a checkpoint's metadata
    describes, each checked as a recipe file would be: a damaged checkpoint is an error, not a traceback."""
    try:
        recipe = recipe_from_dict(meta["recipe"])
        _check_stored_size(recipe, data, ckpt_path)
        model = build_model(recipe)
    except RecipeError as exc:
        listed = "; ".join(str(p) for p in exc.problems[:3]) + ("; ..." if len(exc.problems) > 3 else "")
        raise CheckpointError(f"{ckpt_path}: damaged checkpoint: the recipe inside it is not valid: {listed}") from None
    vocab = stored_vocab(data, ckpt_path)
    for side, tok, size in (
        ("target", vocab.tgt, recipe.model.vocab_size),
        ("source", vocab.src, recipe.model.src_vocab_size),
    ):
        if size is not None and tok.vocab_size != size:
            raise CheckpointError(
                f"{ckpt_path}: damaged checkpoint: its {side} vocabulary has {tok.vocab_size} tokens, its model {size}"
            )
    try:  # checkpoints written before the ids were recorded are tfbuilder's own
        model.specials = (
            SpecialIds.from_dict(meta["specials"], vocab_size=recipe.model.vocab_size) if "specials" in meta else OWN
        )
    except ValueError as exc:
        raise CheckpointError(f"{ckpt_path}: damaged checkpoint: {exc}") from None
    return model, recipe, vocab


def stored_vocab(data: dict, ckpt_path: str | Path) -> Vocab:
    """The vocabulary a checkpoint stores (a damaged one is a CheckpointError); its tokenizers name the
    checkpoint when they fail on a text."""
    try:
        vocab = Vocab.from_json(data["tfbuilder"]["vocab"])
    except DataError as exc:
        raise CheckpointError(f"{ckpt_path}: damaged checkpoint: {exc}") from None
    for tok in (vocab.src, vocab.tgt):
        if isinstance(tok, (BPETokenizer, HFTokenizer, PretrainedTokenizer)):
            tok.where = f"the tokenizer stored in {ckpt_path}"
    return vocab


def finite_weights(data: dict, ckpt_path: str | Path) -> dict[str, torch.Tensor]:
    """The model's weights in ``data``, refused when one is not a finite real number (NaN, inf or complex)."""
    state = model_state(data)
    unfit = next(
        (
            k
            for k, v in state.items()
            if v.is_complex() or (v.is_floating_point() and not bool(torch.isfinite(v).all()))
        ),
        None,
    )
    if unfit is not None:
        raise CheckpointError(
            f"{ckpt_path}: damaged checkpoint: the weights of {unfit} are not finite real numbers (NaN, inf or complex)"
        )
    return state


def _check_stored_size(recipe: Recipe, data: dict, ckpt_path: Path) -> None:
    """Before a stored recipe is built: its model has no more parameters than the checkpoint holds
    weights for, and fits this machine (both counted on the meta device, nothing allocated)."""

    parameters = count_parameters(recipe)
    stored = sum(v.numel() for k, v in data["state_dict"].items() if k.startswith("model."))
    problems = check_size(recipe, parameters, training=False)
    if parameters > stored:
        which = ""
        if not problems:  # a model this machine holds: built on the meta device (nothing allocated) to name them
            with torch.device("meta"):
                shapes = {k: tuple(v.shape) for k, v in build_model(recipe).state_dict().items()}
            which = ": " + shown(mismatches(shapes, model_state(data)))
        raise CheckpointError(
            f"{ckpt_path}: damaged checkpoint: the recipe inside it asks for {parameters:,} parameters, "
            f"but it holds weights for {stored:,}{which}"
        )
    if problems:
        raise CheckpointError(f"{ckpt_path}: {problems[0].message}")


def write_recipe(run_dir: Path, recipe_dict: dict) -> None:
    write_text(run_dir / "recipe.yaml", yaml.safe_dump(recipe_dict, sort_keys=False), what="recipe")


def display_path(path: str | Path) -> str:
    """How a path is shown to the user: relative to the working directory when it lies below it,
    absolute otherwise (one rule for every path a command prints)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def run_dir_of(ckpt_path: Path) -> Path | None:
    """The run directory a checkpoint lies in (``<run>/checkpoints/x.ckpt``), or None for a loose file."""
    return ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else None


def scores_file(run_dir: Path, split: str, checkpoint: str, *, beam: int | None = None, precision: str = "32") -> Path:
    """Where the scores of the checkpoint named ``checkpoint`` (its stem: best, last, ...) on ``split``
    are written: ``<run_dir>/test-<split>-<checkpoint>[-beam<N>][-bf16].json``. The beam (and the
    bfloat16 decoding) are named for models that translate, whose scores depend on the search."""
    search = "" if beam is None else f"-beam{beam}" + ("-bf16" if precision == "bf16" else "")
    return Path(run_dir) / f"test-{split}-{checkpoint}{search}.json"


CHOICES = ("best", "last", "averaged")
STEP_PREFIX = "step-"


def step_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """The kept ``step-<n>.ckpt`` files of a checkpoints folder, oldest first."""
    found = []
    for p in Path(ckpt_dir).glob(f"{STEP_PREFIX}*.ckpt"):
        number = p.stem[len(STEP_PREFIX) :]
        if number.isdigit():
            found.append((int(number), p))
    return sorted(found)


def default_checkpoint(run_dir: Path) -> Path:
    """The checkpoint of a run directory that commands use unless told otherwise: ``best.ckpt``, or
    ``last.ckpt`` (which may not exist yet) when the run never kept a best. The one place of this rule."""
    best = Path(run_dir) / "checkpoints" / "best.ckpt"
    return best if present(best) else best.with_name("last.ckpt")


def choose_checkpoint(path: str | Path, which: str | None = None) -> Path:
    """The checkpoint every command uses: for a run directory ``checkpoints/<which>.ckpt``
    (``best`` by default, ``last`` when the run never kept a best); ``which`` may also be a file."""
    path = Path(path)
    if which is not None and which not in CHOICES:
        return find_checkpoint(which)  # --checkpoint PATH
    if not path.is_dir():
        if which is not None:
            raise CheckpointError(f"--checkpoint {which} names a file of a run directory, but {path} is a file")
        return find_checkpoint(path)
    folder = path / "checkpoints"
    if which is None:
        chosen = default_checkpoint(path)
        return chosen if present(chosen) else find_checkpoint(path)
    chosen = folder / f"{which}.ckpt"
    if not present(chosen):
        hint = " (make it with: tfbuilder average RUN_DIR)" if which == "averaged" else ""
        raise CheckpointError(f"{path} has no checkpoints/{which}.ckpt{hint}")
    return chosen


def mismatches(
    own: dict[str, tuple[int, ...]], state: dict[str, torch.Tensor], *, theirs: str = "checkpoint", ours: str = "recipe"
) -> list[str]:
    """What keeps ``state`` from loading into a model whose tensors have the shapes ``own``: each
    parameter of another shape (both shapes), missing, or unexpected."""
    problems = [
        f"{k}: {theirs} {tuple(state[k].shape)}, {ours} {tuple(v)}"
        for k, v in own.items()
        if k in state and tuple(state[k].shape) != tuple(v)
    ]
    problems += [f"{k}: missing from the {theirs}" for k in own if k not in state]
    problems += [f"{k}: in the {theirs}, not in the {ours}'s model" for k in state if k not in own]
    return problems


def shown(problems: list[str], most: int = 6) -> str:
    """The first ``most`` problems, and how many more."""
    return "; ".join(problems[:most]) + (f"; ... ({len(problems) - most} more)" if len(problems) > most else "")


def fits(model: nn.Module, state: dict[str, torch.Tensor], *, source: str | Path, new: str | None = None) -> None:
    """Refuse (exit 2, naming the parameters) weights that do not fit ``model``: missing, unexpected,
    or of another shape. Checked before anything is created or trained. Keys starting with ``new``
    (a new head, ``"head."``) are left out on both sides. Every command that loads a checkpoint's
    weights into a model (test, translate, export, --init-from, resume) goes through here."""
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if new is not None:
        own = {k: v for k, v in own.items() if not k.startswith(new)}
        state = {k: v for k, v in state.items() if not k.startswith(new)}
    problems = mismatches(own, state)
    if problems:
        raise CheckpointError(f"the weights of {source} do not fit the recipe's model: {shown(problems)}")


def model_state(data: dict) -> dict[str, torch.Tensor]:
    """The model's weights in a checkpoint's ``state_dict`` (Lightning prefixes them with ``model.``)."""
    return {k.removeprefix("model."): v for k, v in data["state_dict"].items() if k.startswith("model.")}


class RunInUse(RunDirError):
    """Another process holds the run's ``fit.lock``: it is training there (a sweep's other worker takes
    the next entry instead)."""


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/fit.lock`` for as long as a fit trains there; the file
    says who holds it (pid, host, since). The kernel drops the lock when the process dies, kill -9 included."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "fit.lock"
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        fd = self._open()
        if not _take(fd):
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise in_use(self.path.parent, holder)
        held = os.pread(fd, 4097, 0)
        if held and (len(held) > 4096 or not _HOLDER.fullmatch(held)):  # not a line a fit wrote: not ours
            os.close(fd)
            raise RunDirError(f"{self.path} holds something other than a fit's lock line: {_LOCK_ADVICE}")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        tag = f" job {joblock.job()}" if joblock.job() else ""  # the other ranks of this job see it is theirs
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}{tag}\n".encode())
        self._fd = fd
        return self

    def _open(self) -> int:
        """The lock file, opened without following a link, never blocking on a FIFO, and refused unless
        it is a plain file of its own (no other name shares it): nothing outside the run is written."""
        try:
            fd, what = open_own(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise RunDirError(f"cannot lock {self.path.parent}: {exc.strerror or exc}") from None
        if fd is None:
            raise RunDirError(f"{self.path} is {what}, not a lock file: {_LOCK_ADVICE}")
        return fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def in_use(run_dir: Path, holder: str) -> RunInUse:
    """The refusal of a run directory another fit trains in (on rank 0, and on every rank of a job)."""
    return RunInUse(
        f"{run_dir} is in use: a fit is training there ({holder}); wait for it, or choose another directory"
    )


def _take(fd: int, tries: int = 5) -> bool:
    """The lock taken, trying again for a moment: another rank of this job may be testing it
    (:func:`tfbuilder.runs.joblock.held_by_another` holds a shared lock for an instant)."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if attempt + 1 < tries:
                time.sleep(0.05)
    return False


_HOLDER = re.compile(rb"pid \d+ on [^\n]* since [^\n]*\n?")
_LOCK_ADVICE = "tfbuilder writes nothing there; move it out of the run directory, then try again"
