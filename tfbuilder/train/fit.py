"""``fit``: train a recipe through Lightning, from a new run, a resumed checkpoint or trained weights.

A fit is one :class:`FitRequest` (its keywords, checked) carried out as a short list of steps
(:func:`run`): the checks first (the pre-flight, where it starts, the room and the machine, the data),
then the run directory, then training. Nothing is created before every check has passed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger

from tfbuilder import torch_state
from tfbuilder.data.prepare import PRETRAINED_WITHOUT_PATH, prepare
from tfbuilder.data.settle import settle
from tfbuilder.errors import TfbuilderError
from tfbuilder.runs.checkpoints import RUN_DIR_ENV, Interrupted
from tfbuilder.spec.recipe import Recipe
from tfbuilder.spec.sections import DataSection
from tfbuilder.train import preflight, stopping
from tfbuilder.train.lifecycle import Claim, Origin, initial_model, read_origin
from tfbuilder.train.progress import global_rank, say
from tfbuilder.train.summary import Summary
from tfbuilder.train.task import Task
from tfbuilder.train.trainer import build, data_module, probe, quiet_lightning


@dataclass(frozen=True)
class FitRequest:
    """What a fit is asked to do (the keywords of :func:`fit`), checked when made: a recipe with data to
    train on, callbacks and loggers that Lightning takes (a clear error, not one from deep inside it)."""

    recipe: Recipe
    resume: str | Path | None = None  # a checkpoint or run directory: the run continues where it lies
    run_dir: str | Path | None = None  # this run's directory: start it there, or continue it from its last.ckpt
    init_from: str | Path | None = None  # a checkpoint whose weights (and vocabulary) a new run starts from
    force: bool = False  # resume a checkpoint written in another directory (a copied or moved run)
    restart: bool = False  # start run_dir over when it stopped before its first checkpoint
    on_step: Callable[[int, int], None] | None = None  # on_step(step, max_steps) after every optimizer step
    callbacks: Sequence[Callback] = ()  # Lightning callbacks, after tfbuilder's own
    loggers: Sequence[Logger] = ()  # Lightning loggers, beside metrics.csv and trainer.loggers
    data: DataSection = field(init=False, repr=False)  # the recipe's data section, checked present

    def __post_init__(self) -> None:
        for what, items, cls in (("callbacks", self.callbacks, Callback), ("loggers", self.loggers, Logger)):
            if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
                raise TfbuilderError(
                    f"fit({what}=...) takes a list of Lightning {cls.__name__} objects, not {type(items).__name__}"
                )
            for i, item in enumerate(items):
                if not isinstance(item, cls):
                    raise TfbuilderError(
                        f"fit({what}=...)[{i}] is a {type(item).__name__}, not a Lightning {cls.__name__}"
                    )
            object.__setattr__(self, what, tuple(items))  # the caller's list may change; the request does not
        object.__setattr__(self, "data", _refuse_untrainable(self.recipe, resume=self.resume, init_from=self.init_from))


def _refuse_untrainable(recipe: Recipe, *, resume: str | Path | None, init_from: str | Path | None) -> DataSection:
    """The recipe's data section, when the recipe can be trained as asked."""
    if recipe.data is None:
        raise TfbuilderError("the recipe has no data section: nothing to train on")
    if recipe.model.pad_id is None and not (recipe.data.batch_size == 1 and recipe.data.max_tokens is None):
        # Padding would be indistinguishable from a token, and would count as a target.
        raise TfbuilderError(
            "model.pad_id is null (no padding token): train with data.batch_size: 1, or set model.pad_id"
        )
    if resume is not None and init_from is not None:
        raise TfbuilderError("give --resume or --init-from, not both")
    tokenizer = recipe.data.tokenizer
    if tokenizer.type == "pretrained" and tokenizer.path is None and resume is None and init_from is None:
        raise TfbuilderError(PRETRAINED_WITHOUT_PATH)  # before anything is prepared or created
    return recipe.data


def _same_world(origin: Origin, world: int) -> None:
    """A checkpoint that records the global data position resumes on any number of processes (the
    global order of batches continues at the first one no rank trained). An older one holds each
    rank's own count of batches: it resumes only with as many processes as the run had, since another
    number would replay some batches and skip others. (Checkpoints of runs that do not record the
    world size were written by one process or by a run that had as many.)"""
    if not origin.resumed or origin.source is None or "data_position" in origin.source["tfbuilder"]:
        return
    saved = origin.source["tfbuilder"].get("world_size")
    if isinstance(saved, int) and saved != world:
        raise TfbuilderError(
            f"the run was trained by {saved} process{'es' if saved > 1 else ''} (world size {saved}); this resume "
            f"would run {world}: its checkpoint (from an older tfbuilder) holds each process's own place in the "
            f"data, so a resume continues exactly only with {saved} (trainer.devices x trainer.num_nodes)"
        )


def _one_run_dir(origin: Origin, world: int, *, launched: bool) -> None:
    """Processes that a launcher started (torchrun, SLURM's srun) each begin the fit on their own: without
    one run directory named for all of them, each would claim a ``version_<n>`` of its own (rank 0's
    trains, the others' stay empty). Refused on every rank, before anything is prepared or created.
    (Processes that Lightning starts from the first one inherit its run directory.)"""
    if world > 1 and launched and origin.run_dir is None:
        raise TfbuilderError(
            f"this process is one of {world} that a launcher started (torchrun, srun): give them all one run "
            f"directory with --run-dir DIR or {RUN_DIR_ENV}=DIR (on a shared file system when they run on "
            "several machines), or continue a run with --resume"
        )


def fit(recipe: Recipe, **options: Any) -> Summary:
    """Train ``recipe`` (or continue the run a checkpoint or run directory belongs to).

    ``run_dir`` (or the ``TFBUILDER_RUN_DIR`` environment variable) names this run's directory instead of
    a new ``<output>/<name>/version_<n>``: the run starts there (created if needed), or, when it holds a
    checkpoint, continues from its ``last.ckpt`` as ``resume`` would, so the same call run again (by a
    scheduler, after a requeue or a crash) carries on where the run stopped; ``init_from`` starts from a
    checkpoint's weights (and vocabulary) with a fresh optimizer and schedule; ``force`` resumes a checkpoint that was
    written in another directory (a copied or moved run); ``restart`` starts ``run_dir`` over when
    it stopped before its first checkpoint (its metrics kept as ``metrics.interrupted-<n>.csv``);
    ``on_step(step, max_steps)`` is called after every optimizer step. ``callbacks`` (Lightning
    callbacks) run after tfbuilder's own, and ``loggers`` (Lightning loggers) receive the metrics
    beside ``metrics.csv`` and those ``trainer.loggers`` names. Every way into a run directory holds
    its ``fit.lock``: a second fit there is refused while one trains. Nothing is created before
    every check has passed. The process's thread count, random generators and deterministic settings
    are given back as they were when ``fit`` returns or raises (:mod:`tfbuilder.torch_state`).

    ``options`` are :class:`FitRequest`'s fields (listed there once; an unknown one is a TypeError)."""
    return run(FitRequest(recipe, **options))


def run(request: FitRequest) -> Summary:
    """Carry out ``request``. A signal before training unwinds the start-up (RunGuard handles those during
    it) into :class:`Interrupted`, saying what was kept; the run directory's lock is released first."""
    claim = Claim()
    with torch_state.kept(), quiet_lightning():
        try:
            with stopping.raising(), claim:
                return _steps(request, claim)
        except stopping.Stop as stop:
            requeued = stopping.requeue(stop.signum) if global_rank() == 0 else None  # SIGUSR1 in a SLURM job
            message = claim.stopped(stop.signum) + (f" {requeued}" if requeued else "")
            raise Interrupted(message, stop.signum) from None
        except TfbuilderError:
            claim.discard()  # refused while setting up (a tracker that would not start): no half-made run left
            raise


def _steps(request: FitRequest, claim: Claim) -> Summary:
    """The steps of a fit, in order."""
    r = request
    # 1. A Trainer this machine can run: accelerator, precision, strategy (the cheapest check first).
    world, launched = probe(r.recipe)
    # 2. The model builds, steps and fits this machine, its data's files are there (the pre-flight),
    #    before any run directory exists. A resumed or initialised run takes its checkpoint's vocabulary.
    preflight.check_run(r.recipe, vocab_given=r.resume is not None or r.init_from is not None)
    started = time.perf_counter()  # the wall time counts the data preparation
    # 3. Where the fit starts (new, resume, init-from), read and checked; an existing run directory is
    #    locked at once, and there must be room for the checkpoints.
    where = read_origin(r.recipe, resume=r.resume, init_from=r.init_from, run_dir=r.run_dir, force=r.force)
    _same_world(where, world)
    _one_run_dir(where, world, launched=launched)
    origin = claim.hold(where, r.recipe)
    # 4. The data: every data problem surfaces here; labelled data gives the recipe its label ids.
    prepared = prepare(r.data, vocab=origin.vocab, model_vocab=r.recipe.model.vocab_size, say=say)
    recipe = settle(r.recipe, prepared)
    preflight.check_split_lengths(recipe, prepared.splits)
    # 5. The model, seeded, with --init-from's weights, and the tokenizer's special ids (decoders and
    #    checkpoints read them there).
    model = initial_model(recipe, origin)
    model.specials = prepared.vocab.specials
    # 6. The run directory, claimed, locked and set up: vocabulary, recipe, a resume's later history set aside.
    # A given run directory starts over when it stopped before its first checkpoint (start or continue).
    restart = r.restart or (origin.run_dir is not None and not origin.resumed)
    run_dir = claim.set_up(recipe, origin, prepared.vocab, restart=restart)
    # 7. The task and its batches.
    task = Task.for_run(recipe, model, prepared, run_dir=run_dir, invocation=origin.invocation, started=started)
    datamodule = data_module(recipe, prepared, task)
    # 8. The Trainer: tfbuilder's callbacks and loggers, then the caller's.
    training = build(
        recipe,
        run_dir,
        datamodule,
        invocation=origin.invocation,
        on_step=r.on_step,
        callbacks=r.callbacks,
        user_loggers=r.loggers,
    )
    claim.training = True
    # 9. Train.
    training.fit(recipe, task, datamodule, checkpoint=origin.checkpoint)
    # 10. What the run did, kept as summary.json.
    summary = Summary.of(recipe, training, task)
    if training.trainer.is_global_zero:
        summary.write(run_dir)
    return summary


__all__ = ["FitRequest", "Summary", "fit", "run"]
