"""The Lightning Trainer of a run: probed before anything is prepared, then built with tfbuilder's callbacks,
plugins and loggers; and Lightning kept quiet while it works."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger

from tfbuilder import devices
from tfbuilder.errors import TfbuilderError
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train.callbacks import AtomicCheckpointIO
from tfbuilder.train.metrics_log import MetricsCSV


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
            strategy=t.strategy,
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
            plugins=[AtomicCheckpointIO()],
            default_root_dir=str(run_dir),
        )
    except (
        ValueError,
        RuntimeError,
        MisconfigurationException,
    ) as exc:  # e.g. a precision or accelerator this machine lacks
        raise TfbuilderError(f"trainer: {exc}") from None
    for csv in (each for each in logger if isinstance(each, MetricsCSV)):
        # Rows are numbered from the optimizer step itself (step n logged as n - 1, as Lightning numbers
        # them), not from Lightning's logging count, which a resume from a checkpoint written while
        # stopping restores one short: every later row would be numbered one lower than in an
        # uninterrupted run, and rows of different steps would share a number.
        csv.step_of = lambda: trainer.global_step - 1
    return trainer


class StepHook(Callback):
    """Calls ``hook(step, max_steps)`` after every optimizer step (progress displays)."""

    def __init__(self, hook: Callable[[int, int], None]):
        self.hook = hook

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self.hook(trainer.global_step, trainer.max_steps)


def probe(recipe: Recipe) -> None:
    """Fail on an accelerator, precision or strategy this machine lacks before any run directory exists."""
    t = recipe.trainer
    if isinstance(t.devices, list) and not accelerated(recipe):
        where = "accelerator: cpu" if t.accelerator == "cpu" else "this machine has no GPU"
        raise TfbuilderError(
            f"trainer.devices {t.devices} names GPUs by index, but training runs on the CPU ({where}): give a number of processes"
        )
    try:
        L.Trainer(
            accelerator=t.accelerator,
            devices=t.devices,
            strategy=t.strategy,
            num_nodes=t.num_nodes,
            precision=t.precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    except (TypeError, ValueError, RuntimeError, MisconfigurationException) as exc:
        raise TfbuilderError(f"trainer: {exc}") from None


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
