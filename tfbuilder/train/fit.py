"""``fit``: train a recipe through Lightning, from a new run, a resumed checkpoint or trained weights."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger
from torch import nn

from tfbuilder import atomic, devices, torch_state
from tfbuilder.data.datamodule import DataModule
from tfbuilder.data.prepare import Prepared, prepare
from tfbuilder.data.settle import settle
from tfbuilder.errors import TfbuilderError
from tfbuilder.runs.checkpoints import RUN_DIR_ENV, Interrupted, RunLock, display_path
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train import diskspace, loggers, memory, preflight, stopping
from tfbuilder.train.callbacks import RunGuard
from tfbuilder.train.lifecycle import (
    Claim,
    Origin,
    _set_up_run_dir,
    claim_run_dir,
    initial_model,
    read_origin,
    stopped_outside_training,
)
from tfbuilder.train.progress import Progress, say
from tfbuilder.train.summary import SCORE_NAMES, Summary
from tfbuilder.train.task import Task
from tfbuilder.train.trainer import StepHook, accelerated, new_trainer, probe, quiet_lightning, world_size


@dataclass
class _Start:
    """What :func:`_train` starts from, once every check has passed and the run directory is set up."""

    recipe: Recipe
    model: nn.Module  # built (and seeded) from the recipe; --init-from's weights loaded
    prepared: Prepared  # the data, as prepare() made it
    vocab_json: str
    run_dir: Path
    origin: Origin  # the checkpoint a resume continues, and this invocation's record
    started: float  # perf_counter() when fit began (data preparation counts in the wall time)
    on_step: Callable[[int, int], None] | None = None
    callbacks: list[Callback] = field(default_factory=list)  # given to fit() in Python, after tfbuilder's own
    loggers: list[Logger] = field(default_factory=list)


def fit(
    recipe: Recipe,
    *,
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
    init_from: str | Path | None = None,
    force: bool = False,
    restart: bool = False,
    on_step: Callable[[int, int], None] | None = None,
    callbacks: Sequence[Callback] = (),
    loggers: Sequence[Logger] = (),
) -> Summary:
    """Train ``recipe`` (or continue the run a checkpoint or run directory belongs to).

    ``run_dir`` trains into that directory (created if needed; refused if it already holds a run)
    instead of a new ``<output>/<name>/version_<n>``; ``init_from`` starts from a checkpoint's weights
    (and vocabulary) with a fresh optimizer and schedule; ``force`` resumes a checkpoint that was
    written in another directory (a copied or moved run); ``restart`` starts ``run_dir`` over when
    it stopped before its first checkpoint (its metrics kept as ``metrics.interrupted-<n>.csv``);
    ``on_step(step, max_steps)`` is called after every optimizer step. ``callbacks`` (Lightning
    callbacks) run after tfbuilder's own, and ``loggers`` (Lightning loggers) receive the metrics
    beside ``metrics.csv`` and those ``trainer.loggers`` names. Every way into a run directory holds
    its ``fit.lock``: a second fit there is refused while one trains. Nothing is created before
    every check has passed. The process's
    thread count, random generators and deterministic settings are given back as they were when
    ``fit`` returns or raises (:mod:`tfbuilder.torch_state`)."""
    extra = _extras(callbacks, loggers)
    with torch_state.kept(), quiet_lightning():
        return _fit(
            recipe,
            resume=resume,
            run_dir=run_dir,
            init_from=init_from,
            force=force,
            restart=restart,
            on_step=on_step,
            extra=extra,
        )


def _extras(callbacks: Sequence[Callback], loggers: Sequence[Logger]) -> tuple[list[Callback], list[Logger]]:
    """``fit``'s callbacks and loggers, each checked to be what Lightning takes (a clear error, not one from deep inside Lightning)."""
    for what, items, cls in (("callbacks", callbacks, Callback), ("loggers", loggers, Logger)):
        if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
            raise TfbuilderError(
                f"fit({what}=...) takes a list of Lightning {cls.__name__} objects, not {type(items).__name__}"
            )
        for i, item in enumerate(items):
            if not isinstance(item, cls):
                raise TfbuilderError(f"fit({what}=...)[{i}] is a {type(item).__name__}, not a Lightning {cls.__name__}")
    return list(callbacks), list(loggers)


def _fit(
    recipe: Recipe,
    *,
    resume: str | Path | None,
    run_dir: str | Path | None,
    init_from: str | Path | None,
    force: bool,
    restart: bool,
    on_step: Callable[[int, int], None] | None,
    extra: tuple[list[Callback], list[Logger]] = ([], []),
) -> Summary:
    _refuse_untrainable(recipe, resume=resume, init_from=init_from)
    at = Claim()
    try:
        with stopping.raising():  # a signal before training starts unwinds start-up (RunGuard handles those during it)
            return _start_and_train(
                recipe,
                resume=resume,
                run_dir=run_dir,
                init_from=init_from,
                force=force,
                restart=restart,
                on_step=on_step,
                at=at,
                extra=extra,
            )
    except stopping.Stop as stop:
        raise Interrupted(stopped_outside_training(stop.signum, at), stop.signum) from None


def _start_and_train(
    recipe: Recipe,
    *,
    resume: str | Path | None,
    run_dir: str | Path | None,
    init_from: str | Path | None,
    force: bool,
    restart: bool,
    on_step: Callable[[int, int], None] | None,
    at: Claim,
    extra: tuple[list[Callback], list[Logger]] = ([], []),
) -> Summary:
    preflight.check_run(recipe)  # builds, steps and fits this machine, before any run directory exists
    start = time.perf_counter()
    origin = at.origin = read_origin(
        recipe, resume=resume, init_from=init_from, run_dir=run_dir, force=force, restart=restart
    )
    rank_zero = rank_zero_only.rank == 0
    lock = None
    if rank_zero and origin.run_dir is not None and (origin.resumed or origin.run_dir.is_dir()):
        # An existing run directory is locked at once: a second fit there is refused before it prepares anything.
        lock = RunLock(origin.run_dir).acquire()
    try:
        if rank_zero:  # room for the checkpoints, before anything is prepared or trained
            target = origin.run_dir if origin.run_dir is not None else Path(recipe.trainer.output) / recipe.name
            diskspace.check_free(recipe, target, resumed=origin.resumed)
        probe(recipe)
        # All data problems surface here, before a run directory exists or anything trains.
        prepared = prepare(recipe.data, vocab=origin.vocab, model_vocab=recipe.model.vocab_size, say=say)
        recipe = settle(recipe, prepared)  # labelled data: label ids, and the mapping recorded in the recipe
        preflight.check_split_lengths(recipe, prepared.splits)
        vocab_json = prepared.vocab.to_json()
        model = initial_model(recipe, origin)
        model.specials = prepared.vocab.specials  # the tokenizer's ids: decoders and checkpoints read them here
        run_dir = at.run_dir = claim_run_dir(recipe, origin.run_dir, create=rank_zero)
        at.fresh = origin.run_dir is None
        if rank_zero and lock is None:
            lock = RunLock(run_dir).acquire()
        if rank_zero:
            _set_up_run_dir(run_dir, recipe, origin, prepared.vocab, restart=restart)
        return _train(_Start(recipe, model, prepared, vocab_json, run_dir, origin, start, on_step, *extra))
    finally:
        if lock is not None:
            lock.release()


def _refuse_untrainable(recipe: Recipe, *, resume: str | Path | None, init_from: str | Path | None) -> None:
    if recipe.data is None:
        raise TfbuilderError("the recipe has no data section: nothing to train on")
    if recipe.model.pad_id is None and not (recipe.data.batch_size == 1 and recipe.data.max_tokens is None):
        # Padding would be indistinguishable from a token, and would count as a target.
        raise TfbuilderError(
            "model.pad_id is null (no padding token): train with data.batch_size: 1, or set model.pad_id"
        )
    if resume is not None and init_from is not None:
        raise TfbuilderError("give --resume or --init-from, not both")


def _train(start: _Start) -> Summary:
    recipe, model, prepared, run_dir, on_step = start.recipe, start.model, start.prepared, start.run_dir, start.on_step
    ckpt_path, invocation = start.origin.checkpoint, start.origin.invocation
    bleu_lines = None
    if recipe.trainer.val_bleu:
        sources, references = prepared.raw["val"]
        bleu_lines = (sources[: recipe.trainer.val_bleu], references[: recipe.trainer.val_bleu])
    task = Task(recipe, model, start.vocab_json, vocab=prepared.vocab, bleu_lines=bleu_lines, started=start.started)
    task.run_dir = str(run_dir.resolve())
    task.invocation = invocation
    if recipe.trainer.compile:
        # Features and the fused loss as one graph (tested to have no breaks for every built-in
        # component); varying batch shapes are traced as dynamic after the first change.
        task.objective = torch.compile(task.objective)
    on_accelerator = accelerated(recipe)
    workers = recipe.data.workers
    if workers == "auto":
        workers = min(4, max(1, (os.cpu_count() or 2) // 2)) if on_accelerator else 0
    datamodule = DataModule(
        prepared,
        recipe.data,
        seed=recipe.trainer.seed,
        workers=workers,
        pin_memory=on_accelerator,
        position_source=lambda: task.batches_seen,
        causal=recipe.model.kind == "decoder",
        specials=prepared.vocab.specials,
    )

    t = recipe.trainer
    ckpt_dir = run_dir / "checkpoints"
    guard = RunGuard(ckpt_dir, monitor=t.monitor, patience=t.patience, keep_last=t.keep_last, log_every=t.log_every)
    guard.record = invocation
    max_steps = t.max_steps
    if t.max_epochs:
        per_epoch = datamodule.sampler("train", train=True).batches_per_epoch // world_size(recipe) or 1
        max_steps = min(max_steps, math.ceil(t.max_epochs * per_epoch / recipe.optim.accumulate))
    # On an accelerator the display reads the loss back (a sync) only every log_every steps.
    threads = devices.threads(t.threads)
    torch.set_num_threads(threads)
    shown = Progress(
        run_dir=display_path(run_dir),
        every=t.log_every,
        read_every=t.log_every if on_accelerator else 1,
        quiet=not t.progress,
        detail=f"{threads} CPU thread{'s' if threads > 1 else ''} (trainer.threads: {t.threads})",
    )
    callbacks: list[Callback] = [guard, shown] + ([StepHook(on_step)] if on_step else []) + start.callbacks
    built = loggers.build(recipe, run_dir)  # metrics.csv first, always
    metrics_to = built + start.loggers
    trainer = new_trainer(recipe, run_dir, callbacks, max_steps, metrics_to)
    if trainer.is_global_zero:
        loggers.start(
            metrics_to, recipe, run_dir
        )  # before the first step: a tracker that cannot start stops the run here
    ours = RUN_DIR_ENV not in os.environ
    os.environ[RUN_DIR_ENV] = str(run_dir)  # inherited by the processes a DDP launcher starts
    gpu = on_accelerator and torch.cuda.is_available()
    memory.reset_peak(gpu)
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path else None, weights_only=True)
    except SystemExit:
        if guard.signum is None:
            raise
        guard.stopped = "interrupted at once"  # a second Ctrl-C: Lightning exits without validating
    except atomic.WriteError as exc:
        if exc.errno not in diskspace.FULL or exc.path is None:
            raise
        what = display_path(exc.path) if run_dir not in exc.path.parents else str(exc.path.relative_to(run_dir))
        each = diskspace.checkpoint_bytes(recipe) if exc.path.suffix == ".ckpt" else None  # else metrics, a summary
        again = (
            f"then continue with: tfbuilder fit --resume {run_dir}"
            if guard.kept_step is not None
            else "then run the same command again"
        )
        free = f"Free at least {diskspace.size(2 * each)} there" if each is not None else "Free some space there"
        raise diskspace.DiskFull(
            f"{diskspace.full_disk_message(exc.path.parent, what, each)} {guard.kept()} {free}, {again}"
        ) from None
    finally:
        if ours:
            os.environ.pop(RUN_DIR_ENV, None)
        loggers.finish(built)
    if guard.signum is not None:
        name = stopping.name(guard.signum)
        raise Interrupted(
            f"{name}: training stopped at step {trainer.global_step}; {guard.kept()} "
            f"Continue with: tfbuilder fit --resume {run_dir}",
            guard.signum,
        )

    stopped = guard.stopped or ("max_steps" if trainer.global_step >= max_steps else "max_minutes")
    invocation["stopped"] = stopped
    best = ckpt_dir / "best.ckpt"
    summary = Summary(
        run_dir=str(run_dir),
        steps=trainer.global_step,
        seconds=task.elapsed(),
        best_val_loss=guard.best_val_loss,
        best_val_ppl=math.exp(min(guard.best_val_loss, 50)) if guard.best_val_loss is not None else None,
        best_checkpoint=str(best) if best.exists() and guard.best_step is not None else None,
        last_checkpoint=str(ckpt_dir / "last.ckpt"),
        tokens_per_s=task.train_tokens / max(task.train_seconds, 1e-9),
        ranks_agree=task.ranks_agree,
        last_val_acc=guard.last_metrics.get("val_acc"),
        train_tokens=task.train_tokens,
        last_val_bleu=guard.last_metrics.get("val_bleu"),
        monitor=guard.monitor,
        best_score=guard.best_score,
        best_step=guard.best_step,
        last_val_step=guard.last_step,
        stopped=stopped,
        history=task.history + [{**invocation, "to_step": trainer.global_step}],
        peak_memory_mb=memory.peak_mb(gpu),
        head_scores=None
        if recipe.model.head is None
        else {
            k: v
            for k, v in guard.last_metrics.items()
            if k in SCORE_NAMES and math.isfinite(v)  # Pearson's r of a constant: none
        },
    )
    if trainer.is_global_zero:
        atomic.write_text(run_dir / "summary.json", json.dumps(asdict(summary), indent=2), what="summary")
    return summary


__all__ = ["Summary", "fit"]
