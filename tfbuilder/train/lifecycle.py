"""Where a fit starts, and the run directory it trains in.

- The origin (:func:`read_origin`): a new run, a resumed checkpoint (``--resume``: the run continues
  where the checkpoint lies) or trained weights (``--init-from``: a new run), read and checked before
  anything is written; with the model it starts from (:func:`initial_model`).
- The run directory: claimed (a new ``<output>/<name>/version_<n>``, or the one given), locked
  (``fit.lock``: one fit at a time), set up (what a killed run left cleared, vocabulary and recipe written)
  and, on a resume from an earlier step, rewound (what came after set aside, never deleted).
- The fit's hold on it all (:class:`Claim`), and what a signal before training leaves behind.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L

from tfbuilder import atomic
from tfbuilder.data.prepare import Vocab
from tfbuilder.model.builder import build_model
from tfbuilder.model.model import Model
from tfbuilder.runs import joblock, vocab_files
from tfbuilder.runs import steps as numbering
from tfbuilder.runs.checkpoints import (
    RUN_DIR_ENV,
    CheckpointError,
    Interrupted,
    RunDirError,
    RunLock,
    check_foreign,
    display_path,
    find_checkpoint,
    finite_weights,
    fits,
    in_use,
    is_empty,
    new_run_dir,
    present,
    read_checkpoint,
    run_dir_of,
    stored_vocab,
    write_recipe,
)
from tfbuilder.runs.rewind import ABANDONED, checkpoint_step, set_aside
from tfbuilder.runs.sharded import SHARDED_OPTIMIZER
from tfbuilder.spec.diffing import MISSING, differences
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train import diskspace, stopping
from tfbuilder.train.heads import transfer
from tfbuilder.train.progress import global_rank, say


def _resume_dir(ckpt_path: Path, ckpt: dict, *, force: bool) -> Path:
    """The run directory a resume continues in: where the checkpoint lies, never anywhere else."""
    run_dir = run_dir_of(ckpt_path)
    if run_dir is None:
        raise RunDirError(
            f"{ckpt_path} is not in a run directory (<run>/checkpoints/): --resume continues a run where it lies. "
            f"To train on from its weights in a new run: tfbuilder fit RECIPE --init-from {ckpt_path}"
        )
    if ("optimizer_states" not in ckpt and not ckpt.get(SHARDED_OPTIMIZER)) or "loops" not in ckpt:
        raise CheckpointError(f"{ckpt_path} holds weights only (an average?): start a new run from it with --init-from")
    recorded = ckpt["tfbuilder"].get("run_dir")
    if (
        recorded
        and run_dir.parent.name == ABANDONED
        and Path(recorded) == run_dir.parent.parent.resolve()
        and not force
    ):
        raise RunDirError(
            f"{ckpt_path} belongs to the history that a resume from an earlier step set aside in "
            f"{display_path(run_dir)}: "
            f"give --force to continue it there as a run of its own, or start a new run from its weights with "
            f"tfbuilder fit RECIPE --init-from {ckpt_path}"
        )
    if recorded and Path(recorded) != run_dir.resolve() and not force:
        raise RunDirError(
            f"{ckpt_path} was written by the run in {recorded}, not {run_dir.resolve()} (copied or moved?); "
            "give --force to continue that run here"
        )
    return run_dir


def _changes(before: dict, after: dict) -> dict[str, list]:
    """The recipe keys a resume changed: ``{"trainer.max_steps": [before, after]}`` (None where a key
    is absent), from :func:`tfbuilder.spec.diffing.differences`, the one place recipes are compared."""

    changed = {}
    for key, *values in differences(before, after, include_name=True):
        a, b = (None if v is MISSING else v for v in values)
        if a != b:  # absent and null are the same here
            changed[key] = [a, b]
    return changed


@dataclass
class Origin:
    """Where a fit starts: a new run, a resumed checkpoint, or trained weights (``--init-from``)."""

    invocation: dict  # this invocation's record in the run's history
    run_dir: Path | None = None  # None: a new <output>/<name>/version_<n>
    checkpoint: Path | None = None  # the checkpoint a resume continues
    source: dict | None = None  # the checkpoint read (resume or init_from)
    source_path: str | Path | None = None
    vocab: Vocab | None = None  # the token ids the weights (or the other ranks) already use

    @property
    def resumed(self) -> bool:
        return self.invocation["kind"] == "resume"

    def read(self) -> tuple[dict, Path] | None:
        """The checkpoint this fit starts from (resume or init_from), as read, and its path; None for a new run."""
        if self.source is None:
            return None
        if self.source_path is None:
            raise ValueError("an origin's checkpoint was read without its path")
        return self.source, Path(self.source_path)


class Claim:
    """A fit's hold on its run directory, from where it starts to the end of training: the origin
    (:meth:`hold`), the directory claimed and set up (:meth:`set_up`), its ``fit.lock`` held until the
    ``with`` block ends, and what a signal or an error before training leaves behind (:meth:`stopped`,
    :meth:`discard`)."""

    def __init__(self) -> None:
        self.origin: Origin | None = None
        self.run_dir: Path | None = None
        self.fresh = False  # the run directory was made by this fit (a new version_<n>)
        self.training = False  # the Trainer is built and its trackers started: what is in run_dir stays
        self.rank_zero = global_rank() == 0
        self.lock: RunLock | None = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def hold(self, origin: Origin, recipe: Recipe) -> Origin:
        """Hold ``origin``'s run directory when it exists (locked at once: a second fit there is refused
        before it prepares anything), once there is room for the checkpoints."""
        self.origin = origin
        self.rank_zero = global_rank() == 0
        if self.rank_zero and origin.run_dir is not None and (origin.resumed or origin.run_dir.is_dir()):
            self.lock = RunLock(origin.run_dir).acquire()
        elif origin.run_dir is not None and origin.run_dir.is_dir():
            # Every rank refuses what rank 0 refuses: a rank that waited for rank 0 would wait forever.
            holder = joblock.held_by_another(origin.run_dir)
            if holder is not None:
                raise in_use(origin.run_dir, holder)
        if self.rank_zero:  # room for the checkpoints, before anything is prepared or trained
            target = origin.run_dir if origin.run_dir is not None else Path(recipe.trainer.output) / recipe.name
            diskspace.check_free(recipe, target, resumed=origin.resumed)
        return origin

    def set_up(self, recipe: Recipe, origin: Origin, vocab: Vocab, *, restart: bool) -> Path:
        """The run directory, claimed (a new ``version_<n>``, or the one given, created) and locked;
        rank 0 sets it up (:func:`_set_up_run_dir`). Called once every check has passed."""
        run_dir = self.run_dir = _claim_run_dir(recipe, origin.run_dir, create=self.rank_zero)
        self.fresh = origin.run_dir is None
        if self.rank_zero and self.lock is None:
            self.lock = RunLock(run_dir).acquire()
        if self.rank_zero:
            _set_up_run_dir(run_dir, recipe, origin, vocab, restart=restart)
        return run_dir

    def stopped(self, signum: int) -> str:
        """The message of a fit stopped by a signal outside its training loop: what was kept, and how to go
        on. A run directory this fit made and trained nothing in goes (it held only the recipe and vocabulary)."""
        name = stopping.name(signum)
        run_dir = self.run_dir or (self.origin.run_dir if self.origin is not None else None)
        last = run_dir / "checkpoints" / "last.ckpt" if run_dir is not None else None
        if last is not None and present(last):
            step = checkpoint_step(last, {})
            held = f"checkpoints/last.ckpt holds step {step}" if step is not None else "checkpoints/last.ckpt is kept"
            return f"{name}: stopped before training went on; {held}. Continue with: tfbuilder fit --resume {run_dir}"
        self._remove_fresh()
        return f"{name}: stopped before the first step; nothing was trained or kept. {Interrupted.AGAIN}"

    def discard(self) -> None:
        """After an error before training began (the lock released): what :meth:`set_up` put in a run
        directory this fit made goes, and the directory when that leaves it empty."""
        if not self.training:
            self._remove_fresh()

    def _remove_fresh(self) -> None:
        run_dir = self.run_dir
        if run_dir is None or not self.fresh or global_rank() != 0:
            return
        for made in ("recipe.yaml", *vocab_files.NAMES, "fit.lock"):
            (run_dir / made).unlink(missing_ok=True)
        for folder in (run_dir / "checkpoints", run_dir):
            try:
                folder.rmdir()  # only when empty: nothing else is removed
            except OSError:
                pass


def read_origin(
    recipe: Recipe,
    *,
    resume: str | Path | None,
    init_from: str | Path | None,
    run_dir: str | Path | None,
    force: bool,
) -> Origin:
    """Read (and check) what the fit starts from; nothing is written."""
    invocation: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "kind": "new", "from_step": 0}
    if resume is not None:
        ckpt_path = find_checkpoint(resume)
        source = read_checkpoint(ckpt_path)  # a damaged checkpoint is reported before anything starts
        run_dir = _resume_dir(ckpt_path, source, force=force)
        meta = source["tfbuilder"]
        changed = _changes(meta["recipe"], recipe.to_dict())
        invocation.update(
            kind="resume", checkpoint=str(ckpt_path), from_step=int(source.get("global_step", 0)), changed=changed
        )
        if meta.get("run_dir") and Path(meta["run_dir"]) != run_dir.resolve():
            invocation["adopted_from"] = meta["run_dir"]
        vocab = stored_vocab(source, ckpt_path)
        return Origin(
            invocation, run_dir=run_dir, checkpoint=ckpt_path, source=source, source_path=ckpt_path, vocab=vocab
        )
    given = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV) or None
    if given is not None:
        shared = Path(given)
        check_foreign(shared)  # every rank reads the same files: a refusal happens on every rank
        if holds_run(shared, restart=True):
            # This run, started before: continue it from its last checkpoint (a scheduler runs the same
            # command again after a requeue, a preemption or a crash).
            return _continued(recipe, shared, init_from=init_from)
        # No checkpoint yet: start it (over, keeping what an attempt stopped before its first checkpoint logged).
        origin = _shared_run_dir(invocation, shared)
    else:
        origin = Origin(invocation)
    if init_from is not None:
        source = read_checkpoint(init_from)
        invocation.update(
            kind="init_from", init_from=str(find_checkpoint(init_from)), source_step=int(source.get("global_step", 0))
        )
        # The weights' token ids mean these tokens.
        origin.source, origin.source_path, origin.vocab = (
            source,
            init_from,
            stored_vocab(source, init_from),
        )
    return origin


def _continued(recipe: Recipe, run_dir: Path, *, init_from: str | Path | None) -> Origin:
    """The run in ``run_dir`` continued from its ``last.ckpt``, as ``--resume run_dir`` does. With
    ``init_from``, the run must have started from those weights (the same command, run again)."""
    origin = read_origin(recipe, resume=run_dir, init_from=None, run_dir=None, force=False)
    origin.invocation["continued"] = True
    if init_from is not None:
        history = origin.source["tfbuilder"].get("history") if origin.source is not None else None
        first = history[0] if isinstance(history, list) and history and isinstance(history[0], dict) else {}
        began = first.get("init_from")
        try:
            wanted = find_checkpoint(init_from).resolve()
        except CheckpointError:  # gone since: only the recorded path can say
            wanted = Path(init_from).resolve()
        if not isinstance(began, str) or Path(began).resolve() != wanted:
            raise RunDirError(
                f"{display_path(run_dir)} holds a run that did not start from --init-from {init_from} "
                f"({'it started from ' + str(began) if began else 'it started from scratch'}): "
                "continue it without --init-from, or name a new directory"
            )
    return origin


def _shared_run_dir(invocation: dict, run_dir: Path) -> Origin:
    """One directory for every process of a job: set by rank 0 for the processes it launches, or by
    the user for a cluster launcher (torchrun, SLURM) that starts all ranks at once. Every rank asks
    for the same prepared data: one prepares it, the others wait for it (the store's lock) and open
    it, so all use the vocabulary it holds."""
    return Origin(invocation, run_dir=run_dir, vocab=vocab_files.read(run_dir))


def initial_model(recipe: Recipe, origin: Origin) -> Model:
    """The model built from the recipe (seeded); ``--init-from`` loads its weights. Weights that do
    not fit (shapes changed by --set) are an error naming the parameters, before anything is written."""
    L.seed_everything(recipe.trainer.seed, workers=True, verbose=False)
    model = build_model(recipe)
    read = origin.read()
    if read is not None:
        source, source_path = read
        weights = finite_weights(source, source_path)  # NaN weights would train to NaN: refused, naming the first
        theirs = source["tfbuilder"]["recipe"]
        if origin.invocation["kind"] == "init_from" and transfer.new_head(recipe.to_dict(), theirs):
            # Fine-tuning with another head (tfbuilder.train.heads.transfer): the body must fit, the head is new.
            fits(model, weights, source=source_path, new=transfer.HEAD)
            dropped = transfer.load_body(model, weights)
            say(transfer.note(str(source_path), recipe.to_dict(), theirs, model, dropped))
            origin.invocation["new_head"] = True
            return model
        fits(model, weights, source=source_path)
        if origin.invocation["kind"] == "init_from":
            model.load_state_dict(weights)
    return model


def _claim_run_dir(recipe: Recipe, run_dir: Path | None, *, create: bool) -> Path:
    if run_dir is None:
        return Path(new_run_dir(recipe.trainer.output, recipe.name))
    if create:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    return Path(run_dir)


def _set_up_run_dir(run_dir: Path, recipe: Recipe, origin: Origin, vocab: Vocab, *, restart: bool = False) -> None:
    """Rank 0, holding the run's lock: clear what a killed run left, write vocabulary and recipe."""
    ckpt_dir = run_dir / "checkpoints"
    if not origin.resumed and holds_run(run_dir, restart=restart):  # another fit made it before we held the lock
        raise RunDirError(f"{run_dir} already holds a run: resume it with --resume {run_dir}")
    atomic.remove_temporaries(ckpt_dir)  # left by a killed run; we hold the lock
    if restart:
        _start_over(run_dir)
    read = origin.read()
    if origin.resumed and read is not None:
        # What the run did after the resumed step is a future this run no longer has: moved aside, never deleted.
        source, checkpoint = read
        step = origin.invocation["from_step"]
        guard = (source.get("callbacks") or {}).get("RunGuard") or {}
        best_step = guard.get("best_step") if isinstance(guard.get("best_step"), int) else None
        numbered = numbering.of(source.get("tfbuilder"))
        moved = set_aside(run_dir, step=step, resumed=checkpoint, best_step=best_step, numbering=numbered)
        if moved.folder is not None:
            origin.invocation["set_aside"] = str(moved.folder.relative_to(run_dir))
            say(moved.line(step))

    if not vocab_files.present(run_dir):
        vocab_files.write(run_dir, vocab)
    if not (run_dir / "recipe.yaml").exists():  # a resumed run keeps the recipe it started with
        write_recipe(run_dir, recipe.to_dict())


def holds_run(run_dir: Path, *, restart: bool = False) -> bool:
    """Whether ``run_dir`` holds a run a new fit would replace: its checkpoints folder (with
    ``restart``: a checkpoint in it; a run stopped before its first checkpoint may start over)."""
    ckpt_dir = run_dir / "checkpoints"
    if not restart or not ckpt_dir.is_dir():
        return ckpt_dir.exists()
    return any(not (p.name.startswith(".") and atomic.TEMP_MARK in p.name) for p in ckpt_dir.iterdir())


def _start_over(run_dir: Path) -> None:
    """A run stopped before its first checkpoint starts over; what each attempt logged is kept as
    ``metrics.interrupted-<n>.csv`` (n = 1, 2, ...: an earlier attempt's file is never replaced)."""
    stale = run_dir / "metrics.csv"
    if stale.exists():
        kept = atomic.move_new(stale, str(run_dir / "metrics.interrupted-{}.csv"))
        say(
            f"{display_path(run_dir)} stopped before its first checkpoint: starting over; "
            f"its metrics were kept as {kept.name}"
        )
    empty = run_dir / "checkpoints"
    if empty.is_dir() and is_empty(empty):
        empty.rmdir()
