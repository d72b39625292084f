"""The Lightning side of a fit: the Trainer probed before anything is prepared; the DataModule; the Trainer
built with tfbuilder's callbacks, plugins and loggers and then the caller's (:func:`build`); training itself,
with a full disk and signals turned into messages that say how to go on (:meth:`Training.fit`); and Lightning
kept quiet while it works."""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import ParallelStrategy

from tfbuilder import atomic, devices
from tfbuilder.data.datamodule import DataModule
from tfbuilder.data.prepare import Prepared
from tfbuilder.errors import TfbuilderError
from tfbuilder.runs import steps as numbering
from tfbuilder.runs.checkpoints import RUN_DIR_ENV, Interrupted, display_path
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train import diskspace, loggers, memory, sharding, stopping
from tfbuilder.train.callbacks import AtomicCheckpointIO, RunGuard
from tfbuilder.train.metrics_log import MetricsCSV
from tfbuilder.train.progress import Progress
from tfbuilder.train.task import Task


def accelerated(recipe: Recipe) -> bool:
    """Whether training runs on a GPU (batches are then built in worker processes, pinned)."""
    accelerator = recipe.trainer.accelerator
    if accelerator == "cpu":
        return False
    if accelerator == "mps":
        return True
    return torch.cuda.is_available()


def world_size(recipe: Recipe) -> int:
    return devices.count(recipe.trainer.devices, gpu=accelerated(recipe)) * recipe.trainer.num_nodes


def data_module(recipe: Recipe, prepared: Prepared, task: Task) -> DataModule:
    """The batches of a run: on a GPU built in worker processes and pinned; the sampler resumes at the
    task's global data position."""
    assert recipe.data is not None  # FitRequest refuses a recipe without data
    on_accelerator = accelerated(recipe)
    asked = recipe.data.workers
    if asked == "auto":
        workers = min(4, max(1, (os.cpu_count() or 2) // 2)) if on_accelerator else 0
    else:
        workers = asked
    module = DataModule(
        prepared,
        recipe.data,
        seed=recipe.trainer.seed,
        workers=workers,
        pin_memory=on_accelerator,
        position_source=task.data_position,
        causal=recipe.model.kind == "decoder",
        specials=prepared.vocab.specials,
    )
    task.batches_in_epoch = module.batches_in_epoch  # the task records the global data position
    return module


@dataclass
class Training:
    """A run's Trainer and what tfbuilder gave it: the :class:`RunGuard` (checkpoints, early stopping,
    signals), the step it stops at, tfbuilder's own loggers (finished when training ends)."""

    trainer: L.Trainer
    guard: RunGuard
    max_steps: int
    own_loggers: list[Logger]
    run_dir: Path
    gpu: bool  # memory is a GPU's (else the process's resident memory)
    stopped: str = "max_steps"  # why training ended: max_steps, max_minutes, or the guard's reason

    def fit(self, recipe: Recipe, task: Task, datamodule: DataModule, *, checkpoint: Path | None) -> None:
        """Train ``task`` (from ``checkpoint``, a resume). A full disk becomes
        :class:`~tfbuilder.train.diskspace.DiskFull` and a signal :class:`Interrupted`, each saying what was kept
        and how to go on."""
        guard, run_dir = self.guard, self.run_dir
        ours = RUN_DIR_ENV not in os.environ
        os.environ[RUN_DIR_ENV] = str(run_dir)  # inherited by the processes a DDP launcher starts
        memory.reset_peak(self.gpu)
        try:
            ckpt_path = str(checkpoint) if checkpoint else None
            self.trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        except SystemExit:
            if guard.signum is None:
                raise
            guard.stopped = "interrupted at once"  # a second Ctrl-C: Lightning exits without validating
        except atomic.WriteError as exc:
            if exc.errno not in diskspace.FULL or exc.path is None:
                raise
            raise diskspace.DiskFull(_disk_full(exc.path, recipe, run_dir, guard)) from None
        finally:
            if ours:
                os.environ.pop(RUN_DIR_ENV, None)
            loggers.finish(self.own_loggers)
        if guard.signum is not None:
            raise Interrupted(self._stopped_by(guard.signum), guard.signum)
        self.stopped = guard.stopped or ("max_steps" if self.trainer.global_step >= self.max_steps else "max_minutes")
        guard.record["stopped"] = self.stopped  # this invocation's record in the run's history

    def _stopped_by(self, signum: int) -> str:
        """What a signal stopped, said by rank 0 (which wrote the checkpoint, and asks SLURM to requeue
        the job); every other rank says only that it stopped with the others."""
        name, step = stopping.name(signum), self.trainer.global_step
        if not self.trainer.is_global_zero:
            return (
                f"{name}: rank {self.trainer.global_rank} stopped at step {step} with every rank; "
                "rank 0 says what was checkpointed"
            )
        requeued = stopping.requeue(signum)
        return (
            f"{name}: training stopped at step {step}; {self.guard.kept()} "
            f"Continue with: tfbuilder fit --resume {self.run_dir}" + (f". {requeued}" if requeued else "")
        )


def _disk_full(path: Path, recipe: Recipe, run_dir: Path, guard: RunGuard) -> str:
    """What a full disk stopped (a checkpoint, the metrics, the summary), what was kept, the room to free,
    and how to go on."""
    what = display_path(path) if run_dir not in path.parents else str(path.relative_to(run_dir))
    each = diskspace.checkpoint_bytes(recipe) if path.suffix == ".ckpt" else None  # else metrics, a summary
    again = (
        f"then continue with: tfbuilder fit --resume {run_dir}"
        if guard.kept_step is not None
        else "then run the same command again"
    )
    free = f"Free at least {diskspace.size(2 * each)} there" if each is not None else "Free some space there"
    return f"{diskspace.full_disk_message(path.parent, what, each)} {guard.kept()} {free}, {again}"


def build(
    recipe: Recipe,
    run_dir: Path,
    datamodule: DataModule,
    *,
    invocation: dict,
    on_step: Callable[[int, int], None] | None,
    callbacks: Sequence[Callback],
    user_loggers: Sequence[Logger],
) -> Training:
    """The Trainer of a run: the :class:`RunGuard` and the progress display, ``on_step``, then the caller's
    ``callbacks``; ``metrics.csv`` and ``trainer.loggers``, then the caller's loggers, all started here (a
    tracker that cannot start stops the run before its first step). Sets the process's thread count."""
    t = recipe.trainer
    guard = RunGuard(
        run_dir / "checkpoints", monitor=t.monitor, patience=t.patience, keep_last=t.keep_last, log_every=t.log_every
    )
    guard.record = invocation
    max_steps = _max_steps(recipe, datamodule)
    threads = devices.threads(t.threads)
    torch.set_num_threads(threads)
    on_accelerator = accelerated(recipe)
    shown = Progress(
        run_dir=display_path(run_dir),
        every=t.log_every,
        read_every=t.log_every if on_accelerator else 1,  # on an accelerator the loss is read back (a sync) rarely
        quiet=not t.progress,
        detail=f"{threads} CPU thread{'s' if threads > 1 else ''} (trainer.threads: {t.threads})",
    )
    hooks: list[Callback] = [guard, shown, *([StepHook(on_step)] if on_step else []), *callbacks]
    own = loggers.build(recipe, run_dir)  # metrics.csv first, always
    metrics_to = own + list(user_loggers)
    trainer = new_trainer(recipe, run_dir, hooks, max_steps, metrics_to)
    if trainer.is_global_zero:
        loggers.start(
            metrics_to, recipe, run_dir
        )  # before the first step: a tracker that cannot start stops the run here
    return Training(trainer, guard, max_steps, own, run_dir, gpu=on_accelerator and torch.cuda.is_available())


def _max_steps(recipe: Recipe, datamodule: DataModule) -> int:
    """``trainer.max_steps``, or the optimizer step ``trainer.max_epochs`` comes to when sooner."""
    t = recipe.trainer
    if not t.max_epochs:
        return t.max_steps
    per_epoch = datamodule.sampler("train", train=True).batches_per_epoch // world_size(recipe) or 1
    return min(t.max_steps, math.ceil(t.max_epochs * per_epoch / recipe.optim.accumulate))


def _cluster_environment() -> list[SLURMEnvironment]:
    """Under SLURM, Lightning's environment with its own requeue switched off: tfbuilder's stop handler
    takes SIGUSR1 as it takes SIGTERM (one checkpoint written the normal way) and then requeues the job
    itself (:func:`tfbuilder.train.stopping.requeue`). Lightning's would write a checkpoint of its own
    (``hpc_ckpt_<n>.ckpt``, which nothing reads) and requeue from every path, resumed or not."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def strategy(recipe: Recipe) -> str | sharding.ShardedStrategy:
    """Lightning's strategy for ``trainer.strategy``: fsdp is FSDP2 with a shard per process
    (:mod:`tfbuilder.train.sharding`)."""
    if recipe.trainer.strategy == "fsdp":
        return sharding.ShardedStrategy(world_size(recipe))
    return recipe.trainer.strategy


def new_trainer(
    recipe: Recipe, run_dir: Path, callbacks: list[Callback], max_steps: int, logger: list[Logger]
) -> L.Trainer:
    t, optim = recipe.trainer, recipe.optim
    try:
        trainer = L.Trainer(
            max_steps=max_steps,
            max_time=timedelta(minutes=t.max_minutes) if t.max_minutes else None,
            val_check_interval=t.val_every * optim.accumulate,
            check_val_every_n_epoch=None,
            limit_val_batches=t.val_batches or 1.0,
            log_every_n_steps=t.log_every,
            precision=t.precision,
            accelerator=t.accelerator,
            devices=t.devices,
            strategy=strategy(recipe),
            num_nodes=t.num_nodes,
            deterministic=t.deterministic,
            accumulate_grad_batches=optim.accumulate,
            gradient_clip_val=optim.grad_clip,
            enable_progress_bar=False,  # progress.Progress shows the run
            callbacks=callbacks,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,  # the bucketing sampler splits batches across ranks itself
            logger=logger,
            enable_checkpointing=False,  # RunGuard writes every checkpoint
            plugins=[AtomicCheckpointIO(), *_cluster_environment()],
            default_root_dir=str(run_dir),
        )
    except (
        ValueError,
        RuntimeError,
        MisconfigurationException,
    ) as exc:  # e.g. a precision or accelerator this machine lacks
        raise TfbuilderError(f"trainer: {exc}") from None
    for each in logger:
        number(each, lambda: logged_step(trainer))
    return trainer


def logged_step(trainer: L.Trainer) -> int:
    """The number a metrics row of ``trainer``'s current step gets in every logger: the optimizer step
    itself (the console's and the checkpoints' number; :mod:`tfbuilder.runs.steps`), not Lightning's
    logging count, which is one lower and which a resume from a checkpoint written while stopping
    restores one short again (rows of different steps would share a number)."""
    task = trainer.lightning_module
    kept = task.metrics_steps if isinstance(task, Task) else numbering.OPTIMIZER
    return trainer.global_step - numbering.offset(kept)


def number(logger: Logger, step_of: Callable[[], int]) -> None:
    """Have ``logger`` number its rows by ``step_of()`` rather than by the step Lightning passes."""
    if isinstance(logger, MetricsCSV):
        logger.step_of = step_of
        return
    log = logger.log_metrics

    def log_metrics(metrics: dict[str, float], step: int | None = None) -> None:
        log(metrics, step_of())

    logger.log_metrics = log_metrics  # type: ignore[method-assign]  # Lightning's loggers, TensorBoard's and the caller's


class StepHook(Callback):
    """Calls ``hook(step, max_steps)`` after every optimizer step (progress displays)."""

    def __init__(self, hook: Callable[[int, int], None]):
        self.hook = hook

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self.hook(trainer.global_step, trainer.max_steps)


def probe(recipe: Recipe) -> tuple[int, bool]:
    """Fail on an accelerator, precision or strategy this machine lacks before any run directory exists;
    else the number of processes the run will have (its world size), and whether a launcher (torchrun,
    SLURM's srun) started each of them, rather than Lightning starting them from this one."""
    t = recipe.trainer
    if isinstance(t.devices, list) and not accelerated(recipe):
        where = "accelerator: cpu" if t.accelerator == "cpu" else "this machine has no GPU"
        raise TfbuilderError(
            f"trainer.devices {t.devices} names GPUs by index, but training runs on the CPU ({where}): "
            "give a number of processes"
        )
    try:
        trial = L.Trainer(
            accelerator=t.accelerator,
            devices=t.devices,
            strategy=strategy(recipe),
            num_nodes=t.num_nodes,
            precision=t.precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    except (TypeError, ValueError, RuntimeError, MisconfigurationException) as exc:
        raise TfbuilderError(f"trainer: {exc}") from None
    chosen = trial.strategy  # only a strategy of several processes has a cluster environment
    environment = chosen.cluster_environment if isinstance(chosen, ParallelStrategy) else None
    external = environment is not None and environment.creates_processes_externally
    return trial.world_size, external


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Keep Lightning's start-up chatter (device lists, tips and adverts, a deprecation in its own
    code) off the terminal while the body runs, from the CLI and the Python API alike: the progress
    display and the summary say what happens. Warnings about the user's setup still show. The
    loggers' levels and the warnings filters are given back afterwards, so a notebook that calls
    ``fit`` keeps its own logging."""
    names = (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
    )
    levels = {name: logging.getLogger(name).level for name in names}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
        # The Task's own hook is the one meant (it counts target tokens on the host); Lightning warns
        # that a DataModule is also given.
        warnings.filterwarnings("ignore", message=r".*overridden `on_before_batch_transfer`", category=UserWarning)
        try:
            for name in names:
                logging.getLogger(name).setLevel(logging.WARNING)
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
