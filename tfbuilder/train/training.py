"""Training through Lightning: the LightningModule, the Trainer it is given, and :func:`fit`.

The model stays a plain ``nn.Module``. Lightning is imported by this module, callbacks.py,
metrics_log.py, data/datamodule.py and the CLI, and by no other.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import Logger
from torch import nn

from tfbuilder import atomic, devices, registry, torch_state
from tfbuilder.data.datamodule import DataModule
from tfbuilder.data.prepare import Prepared, Vocab, prepare
from tfbuilder.data.settle import settle
from tfbuilder.errors import TfbuilderError
from tfbuilder.inference.translate import translate
from tfbuilder.model.builder import build_model
from tfbuilder.runs import vocab_files
from tfbuilder.runs.checkpoints import (
    RUN_DIR_ENV,
    CheckpointError,
    Interrupted,
    RunDirError,
    RunLock,
    check_foreign,
    display_path,
    find_checkpoint,
    fits,
    is_empty,
    model_state,
    new_run_dir,
    read_checkpoint,
    run_dir_of,
    write_recipe,
)
from tfbuilder.runs.rewind import ABANDONED, checkpoint_step, set_aside
from tfbuilder.spec.diffing import MISSING, differences
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train import diskspace, loggers, memory, objectives, preflight, stopping
from tfbuilder.train.callbacks import AtomicCheckpointIO, NonFiniteLoss, RunGuard
from tfbuilder.train.heads import metrics as head_metrics
from tfbuilder.train.heads import transfer
from tfbuilder.train.metrics_log import MetricsCSV
from tfbuilder.train.optimizers import build_optimizer
from tfbuilder.train.progress import Progress
from tfbuilder.train.schedules import learning_rate
from tfbuilder.version import __version__

log = logging.getLogger("tfbuilder")


def batch_seed(seed: int, position: int, rank: int) -> int:
    """The seed of one training batch: dropout and masking depend only on (seed, batch, rank), so a
    resumed run draws exactly what an uninterrupted one would."""
    return (seed * 0x9E3779B1 + position * 0x85EBCA77 + rank * 0xC2B2AE3D) % (2**63 - 1)


class Task(L.LightningModule):
    """Optimises a tfbuilder model on the recipe's objective; logs loss, perplexity, accuracy, lr, tokens/s."""

    def __init__(
        self,
        recipe: Recipe,
        model: nn.Module,
        vocab_json: str,
        *,
        vocab: Vocab | None = None,
        bleu_lines: tuple[list[str], list[str]] | None = None,
        started: float | None = None,
    ):
        super().__init__()
        self.model = model
        self.recipe = recipe
        self.vocab_json = vocab_json
        self.vocab = vocab
        self.bleu_lines = bleu_lines  # (sources, references) translated at each validation
        self.batches_seen = 0  # training batches consumed over the whole run (resume restarts here)
        # Totals over the whole run, carried across resumes: target tokens and seconds of training
        # steps (validation excluded), and wall time.
        self.train_tokens = 0
        self.train_seconds = 0.0
        self.elapsed_before = 0.0
        # When this invocation started (fit() passes its own start: data preparation is included).
        self.started = time.perf_counter() if started is None else started
        self.objective = objectives.objective(recipe, epsilon=recipe.optim.label_smoothing)
        self._val = torch.zeros(3, dtype=torch.float64)
        self.head = (
            recipe.model.head
        )  # a sequence head's scores: sums over the validation (tfbuilder.train.heads.metrics)
        self._head_sums: torch.Tensor | None = None
        self._clock = 0.0
        self._tokens_per_s = 0.0
        self.ranks_agree: bool | None = None
        self.bad_step: torch.Tensor | None = None  # first step with a non-finite loss (0: none)
        self._window_tokens: torch.Tensor | int = 0  # target tokens of the micro-batches since the last step
        self.run_dir: str | None = None  # recorded in checkpoints: a resume elsewhere is refused
        self.history: list[dict] = []  # earlier invocations (from the resumed checkpoint)
        self.invocation: dict = {}  # this invocation's record; its to_step follows the checkpoints

    # --- training -----------------------------------------------------------------------------
    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        # Counted on the host before the batch moves: reading the count back from an accelerator
        # every step would wait for it (a host-device sync).
        self._host_tokens = objectives.target_tokens(batch, self.model.pad_id, self.recipe.model.kind)
        return batch

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        torch.manual_seed(batch_seed(self.recipe.trainer.seed, self.batches_seen, self.global_rank))
        self._clock = time.perf_counter()

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        result = self.objective(self.model, batch)
        aux = self.model.auxiliary_loss()  # mixture-of-experts layers add their load-balancing losses
        if aux is not None:
            self.log("moe_aux_loss", aux)
            result.loss = result.loss + aux
        self.note_finite(result.loss)
        size = self._host_tokens
        self._batch_tokens = size
        self.log("train_loss", result.loss, prog_bar=True, batch_size=size)
        # Over the tokens the objective predicted (a masked LM: its masked share), as validation does;
        # tokens/s counts every target token the step read.
        predicted = result.tokens.clamp(min=1)
        if self.head is None:
            self.log("train_ppl", torch.exp(result.nll / predicted), batch_size=size)
        if self.head is None or self.head.type == "classify":
            self.log("train_acc", result.correct.float() / predicted, batch_size=size)
        if self.recipe.optim.accumulate > 1:
            # Lightning averages the k micro-batches' losses; a step must instead average over their
            # target tokens, as one batch k times larger would. The token-summed loss is returned here
            # and the gradient divided by the window's tokens before the step (and before clipping).
            self._window_tokens = self._window_tokens + result.tokens
            return result.loss * result.tokens
        return result.loss

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.recipe.optim.accumulate == 1:
            return
        tokens = self._window_tokens
        self._window_tokens = 0
        world = self.trainer.world_size
        if world > 1:  # every rank divides by the same count: the tokens of the step on all ranks
            tokens = self.trainer.strategy.reduce(tokens.double(), reduce_op="sum")
        # The gradients are the sum over the window divided by k (Lightning), averaged over ranks.
        scale = self.trainer.accumulate_grad_batches * world / tokens.double().clamp(min=1)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, scale.to(grads[0].dtype))

    def note_finite(self, loss: torch.Tensor) -> None:
        """Remember the first step whose loss is not finite, on the device and without a host sync
        (RunGuard reads it every ``log_every`` steps and before every checkpoint)."""
        if self.bad_step is None or self.bad_step.device != loss.device:
            self.bad_step = torch.zeros((), dtype=torch.int64, device=loss.device)
        step = torch.full_like(self.bad_step, self.global_step + 1)
        first = (self.bad_step == 0) & ~torch.isfinite(loss.detach())
        self.bad_step = torch.where(first, step, self.bad_step)

    def elapsed(self) -> float:
        """Wall seconds of the whole run so far, earlier invocations (before a resume) included."""
        return self.elapsed_before + time.perf_counter() - self.started

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.batches_seen += 1
        elapsed = time.perf_counter() - self._clock
        self.train_tokens += int(self._batch_tokens)
        self.train_seconds += elapsed
        rate = self._batch_tokens / max(elapsed, 1e-9)
        self._tokens_per_s = rate if self._tokens_per_s == 0 else 0.9 * self._tokens_per_s + 0.1 * rate
        self.log("tokens_per_s", self._tokens_per_s, prog_bar=True)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], prog_bar=True)

    # --- validation ---------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val = torch.zeros(3, dtype=torch.float64, device=self.device)
        if self.head is not None:
            self._head_sums = torch.zeros(
                head_metrics.size(self.head.type, self.head.outputs), dtype=torch.float64, device=self.device
            )

    def validation_step(self, batch, batch_idx: int) -> None:
        result = self.objective(self.model, batch)
        # Summed on the device; read once, when the validation ends.
        self._val += torch.stack([result.nll.double(), result.correct.double(), result.tokens.double()])
        if self._head_sums is not None:
            self._head_sums += head_metrics.batch_sums(
                self.head.type, result.outputs, batch["labels"], self.head.outputs
            )

    def on_validation_epoch_end(self) -> None:
        nll, correct, tokens = self.trainer.strategy.reduce(self._val, reduce_op="sum").tolist()
        loss = nll / max(tokens, 1)
        self.log("val_loss", loss, prog_bar=True, sync_dist=False, rank_zero_only=False)
        if self._head_sums is not None:  # accuracy and macro-F1, or MSE and Pearson's r
            sums = self.trainer.strategy.reduce(self._head_sums, reduce_op="sum")
            for name, value in head_metrics.scores(self.head.type, sums, self.head.outputs, prefix="val_").items():
                self.log(name, value, sync_dist=False)
            return
        self.log("val_ppl", math.exp(min(loss, 50)), sync_dist=False)
        self.log("val_acc", correct / max(tokens, 1), sync_dist=False)
        if self.bleu_lines is not None:
            self.log("val_bleu", self.validation_bleu(), sync_dist=False)

    def validation_bleu(self) -> float:
        """sacreBLEU of greedy translations of ``bleu_lines`` (every rank computes the same score)."""
        import sacrebleu

        sources, references = self.bleu_lines
        hypotheses = list(translate(self.model, self.vocab, sources, beam=1))
        self.model.train(self.training)
        return sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score

    # --- optimisation ---------------------------------------------------------------------------
    def configure_optimizers(self):
        optim, trainer = self.recipe.optim, self.recipe.trainer
        optimizer = build_optimizer(self.model, optim)
        rate = learning_rate(
            optim.schedule, d_model=self.recipe.model.d_model, lr=optim.lr, max_steps=trainer.max_steps
        )
        # LambdaLR multiplies the base lr (1.0) by rate(step); the paper counts steps from 1.
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: rate(step + 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- checkpoints ----------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tfbuilder"] = {
            "version": __version__,
            "recipe": self.recipe.to_dict(),
            "vocab": self.vocab_json,
            "batches_seen": self.batches_seen,
            "train_tokens": self.train_tokens,
            "train_seconds": self.train_seconds,
            "elapsed": self.elapsed(),
            "run_dir": self.run_dir,
            "history": self.history + [{**self.invocation, "to_step": self.global_step}],
            "components": registry.provenance([params for _, params in self.recipe.model.components()]),
            "specials": self.model.specials.to_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint["tfbuilder"]
        self.batches_seen = int(saved["batches_seen"])
        self.train_tokens = int(saved.get("train_tokens", 0))
        self.train_seconds = float(saved.get("train_seconds", 0.0))
        self.elapsed_before = float(saved.get("elapsed", 0.0))
        self.history = list(saved.get("history") or [])

    def on_train_end(self) -> None:
        if self.trainer.world_size > 1:
            # Every rank must end with the same weights; check it rather than assume it.
            digest = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).sum().reshape(1)
            gathered = self.all_gather(digest.to(self.device)).flatten()
            self.ranks_agree = bool(torch.all(gathered == gathered[0]))


SCORE_NAMES = {"val_acc": "accuracy", "val_f1": "macro-F1", "val_mse": "MSE", "val_pearson": "Pearson r"}


@dataclass
class Summary:
    """What ``fit`` reports when it ends (also ``summary.json``)."""

    run_dir: str
    steps: int
    seconds: float
    best_val_loss: float | None
    best_val_ppl: float | None
    best_checkpoint: str | None
    last_checkpoint: str
    tokens_per_s: float
    ranks_agree: bool | None
    last_val_acc: float | None = None
    train_tokens: int = 0
    last_val_bleu: float | None = None
    monitor: str = "val_loss"
    best_score: float | None = None  # of the monitor, at best_step (= best.ckpt)
    best_step: int | None = None
    last_val_step: int | None = None  # = last.ckpt
    stopped: str = "max_steps"
    history: list[dict] = field(default_factory=list)  # every invocation: new, resumes, with what changed
    head_scores: dict[str, float] | None = (
        None  # a sequence head's last validation: val_acc, val_f1 or val_mse, val_pearson
    )
    peak_memory_mb: float | None = (
        None  # this invocation's peak: GPU memory allocated, or the process's resident memory on a CPU
    )

    def lines(self) -> list[str]:
        best = (
            "n/a"
            if self.best_val_loss is None
            else f"{self.best_val_loss:.4f}"
            + ("" if self.head_scores is not None else f" (perplexity {self.best_val_ppl:.2f})")
        )
        rows = [
            ("run directory", display_path(self.run_dir)),
            ("steps", f"{self.steps:,} ({self.stopped})"),
            ("wall time", f"{self.seconds:.1f} s"),
            ("best validation loss", best),
        ]
        if self.head_scores is not None:
            rows += [(f"last validation {SCORE_NAMES[k]}", f"{v:.4f}") for k, v in self.head_scores.items()]
        else:
            rows.append(
                (
                    "last validation accuracy",
                    "n/a" if self.last_val_acc is None else f"{self.last_val_acc:.2%} of target tokens",
                )
            )
        if self.last_val_bleu is not None:
            rows.append(("last validation BLEU", f"{self.last_val_bleu:.2f} (greedy, subset)"))
        rows += [
            ("tokens/s (training steps)", f"{self.tokens_per_s:,.0f} (mean of {self.train_tokens:,} target tokens)")
        ]
        if self.peak_memory_mb is not None:
            rows.append(("peak memory", f"{self.peak_memory_mb:,.0f} MiB"))
        if self.best_checkpoint:
            rows.append(
                (
                    "best checkpoint",
                    f"{display_path(self.best_checkpoint)} (step {self.best_step}, {self.monitor} {self.best_score:.4f})",
                )
            )
        else:
            rows.append(("best checkpoint", "n/a"))
        rows.append(("last checkpoint", f"{display_path(self.last_checkpoint)} (step {self.last_val_step})"))
        if self.ranks_agree is not None:
            rows.append(("ranks agree", "yes" if self.ranks_agree else "NO"))
        width = max(len(k) for k, _ in rows)
        return [f"{k.ljust(width)}  {v}" for k, v in rows]


def _accelerated(recipe: Recipe) -> bool:
    """Whether training runs on a GPU (batches are then built in worker processes, pinned)."""
    accelerator = recipe.trainer.accelerator
    if accelerator == "cpu":
        return False
    if accelerator == "mps":
        return True
    return torch.cuda.is_available()


def _world(recipe: Recipe) -> int:
    return devices.count(recipe.trainer.devices, gpu=_accelerated(recipe)) * recipe.trainer.num_nodes


def _trainer(
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


def _probe(recipe: Recipe) -> None:
    """Fail on an accelerator, precision or strategy this machine lacks before any run directory exists."""
    t = recipe.trainer
    if isinstance(t.devices, list) and not _accelerated(recipe):
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


def _resume_dir(ckpt_path: Path, ckpt: dict, *, force: bool) -> Path:
    """The run directory a resume continues in: where the checkpoint lies, never anywhere else."""
    run_dir = run_dir_of(ckpt_path)
    if run_dir is None:
        raise RunDirError(
            f"{ckpt_path} is not in a run directory (<run>/checkpoints/): --resume continues a run where it lies. "
            f"To train on from its weights in a new run: tfbuilder fit RECIPE --init-from {ckpt_path}"
        )
    if "optimizer_states" not in ckpt or "loops" not in ckpt:
        raise CheckpointError(f"{ckpt_path} holds weights only (an average?): start a new run from it with --init-from")
    recorded = ckpt["tfbuilder"].get("run_dir")
    if (
        recorded
        and run_dir.parent.name == ABANDONED
        and Path(recorded) == run_dir.parent.parent.resolve()
        and not force
    ):
        raise RunDirError(
            f"{ckpt_path} belongs to the history that a resume from an earlier step set aside in {display_path(run_dir)}: "
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


@dataclass
class _Origin:
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


@dataclass
class _Start:
    """What :func:`_train` starts from, once every check has passed and the run directory is set up."""

    recipe: Recipe
    model: nn.Module  # built (and seeded) from the recipe; --init-from's weights loaded
    prepared: Prepared  # the data, as prepare() made it
    vocab_json: str
    run_dir: Path
    origin: _Origin  # the checkpoint a resume continues, and this invocation's record
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
    at = _Claim()
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
        raise Interrupted(_stopped_outside_training(stop.signum, at), stop.signum) from None


@dataclass
class _Claim:
    """How far a fit got before training: what a signal then leaves behind."""

    origin: _Origin | None = None
    run_dir: Path | None = None
    fresh: bool = False  # the run directory was made by this fit (a new version_<n>)


def _stopped_outside_training(signum: int, at: _Claim) -> str:
    """The message of a fit stopped by a signal outside its training loop: what was kept, and how to go on.
    A run directory this fit made and trained nothing in goes (it held only the recipe and vocabulary)."""
    name = stopping.name(signum)
    run_dir = at.run_dir or (at.origin.run_dir if at.origin is not None else None)
    last = run_dir / "checkpoints" / "last.ckpt" if run_dir is not None else None
    if last is not None and last.is_file():
        step = checkpoint_step(last, {})
        held = f"checkpoints/last.ckpt holds step {step}" if step is not None else "checkpoints/last.ckpt is kept"
        return f"{name}: stopped before training went on; {held}. Continue with: tfbuilder fit --resume {run_dir}"
    if run_dir is not None and at.fresh and rank_zero_only.rank == 0:
        for made in ("recipe.yaml", *vocab_files.NAMES, "fit.lock"):
            (run_dir / made).unlink(missing_ok=True)
        for folder in (run_dir / "checkpoints", run_dir):
            try:
                folder.rmdir()  # only when empty: nothing else is removed
            except OSError:
                pass
    return f"{name}: stopped before the first step; nothing was trained or kept. {Interrupted.AGAIN}"


def _start_and_train(
    recipe: Recipe,
    *,
    resume: str | Path | None,
    run_dir: str | Path | None,
    init_from: str | Path | None,
    force: bool,
    restart: bool,
    on_step: Callable[[int, int], None] | None,
    at: _Claim,
    extra: tuple[list[Callback], list[Logger]] = ([], []),
) -> Summary:
    preflight.check_run(recipe)  # builds, steps and fits this machine, before any run directory exists
    start = time.perf_counter()
    origin = at.origin = _origin(
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
        _probe(recipe)
        # All data problems surface here, before a run directory exists or anything trains.
        prepared = prepare(recipe.data, vocab=origin.vocab, model_vocab=recipe.model.vocab_size, say=_say)
        recipe = settle(recipe, prepared)  # labelled data: label ids, and the mapping recorded in the recipe
        preflight.check_split_lengths(recipe, prepared.splits)
        vocab_json = prepared.vocab.to_json()
        model = _initial_model(recipe, origin)
        model.specials = prepared.vocab.specials  # the tokenizer's ids: decoders and checkpoints read them here
        run_dir = at.run_dir = _claim_run_dir(recipe, origin.run_dir, create=rank_zero)
        at.fresh = origin.run_dir is None
        if rank_zero and lock is None:
            lock = RunLock(run_dir).acquire()
        if rank_zero:
            _set_up_run_dir(run_dir, recipe, origin, prepared.vocab, restart=restart)
        return _train(_Start(recipe, model, prepared, vocab_json, run_dir, origin, start, on_step, *extra))
    finally:
        if lock is not None:
            lock.release()


def _say(line: str) -> None:
    """One line on the terminal from the first process (what the data preparation did)."""
    if rank_zero_only.rank == 0:
        print(line, file=sys.stderr, flush=True)


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


def _origin(
    recipe: Recipe,
    *,
    resume: str | Path | None,
    init_from: str | Path | None,
    run_dir: str | Path | None,
    force: bool,
    restart: bool = False,
) -> _Origin:
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
        vocab = Vocab.from_json(meta["vocab"])
        return _Origin(
            invocation, run_dir=run_dir, checkpoint=ckpt_path, source=source, source_path=ckpt_path, vocab=vocab
        )
    if run_dir is not None or os.environ.get(RUN_DIR_ENV):
        origin = _shared_run_dir(
            invocation, Path(run_dir if run_dir is not None else os.environ[RUN_DIR_ENV]), restart=restart
        )
    else:
        origin = _Origin(invocation)
    if init_from is not None:
        source = read_checkpoint(init_from)
        invocation.update(
            kind="init_from", init_from=str(find_checkpoint(init_from)), source_step=int(source.get("global_step", 0))
        )
        # The weights' token ids mean these tokens.
        origin.source, origin.source_path, origin.vocab = (
            source,
            init_from,
            Vocab.from_json(source["tfbuilder"]["vocab"]),
        )
    return origin


def _shared_run_dir(invocation: dict, run_dir: Path, *, restart: bool = False) -> _Origin:
    """One directory for every process of a job: set by rank 0 for the processes it launches, or by
    the user for a cluster launcher (torchrun, SLURM) that starts all ranks at once. Every rank asks
    for the same prepared data: one prepares it, the others wait for it (the store's lock) and open
    it, so all use the vocabulary it holds."""
    if rank_zero_only.rank == 0:
        check_foreign(run_dir)
    if rank_zero_only.rank == 0 and holds_run(run_dir, restart=restart):
        raise RunDirError(f"{run_dir} already holds a run: resume it with --resume {run_dir}")

    return _Origin(invocation, run_dir=run_dir, vocab=vocab_files.read(run_dir))


def _initial_model(recipe: Recipe, origin: _Origin) -> nn.Module:
    """The model built from the recipe (seeded); ``--init-from`` loads its weights. Weights that do
    not fit (shapes changed by --set) are an error naming the parameters, before anything is written."""
    L.seed_everything(recipe.trainer.seed, workers=True, verbose=False)
    model = build_model(recipe)
    if origin.source is not None:
        weights = model_state(origin.source)
        theirs = origin.source["tfbuilder"]["recipe"]
        if origin.invocation["kind"] == "init_from" and transfer.new_head(recipe.to_dict(), theirs):
            # Fine-tuning with another head (tfbuilder.train.heads.transfer): the body must fit, the head is new.
            fits(model, weights, source=origin.source_path, new=transfer.HEAD)
            dropped = transfer.load_body(model, weights)
            _say(transfer.note(str(origin.source_path), recipe.to_dict(), theirs, model, dropped))
            origin.invocation["new_head"] = True
            return model
        fits(model, weights, source=origin.source_path)
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


def _set_up_run_dir(run_dir: Path, recipe: Recipe, origin: _Origin, vocab: Vocab, *, restart: bool = False) -> None:
    """Rank 0, holding the run's lock: clear what a killed run left, write vocabulary and recipe."""
    ckpt_dir = run_dir / "checkpoints"
    if not origin.resumed and holds_run(run_dir, restart=restart):  # another fit made it before we held the lock
        raise RunDirError(f"{run_dir} already holds a run: resume it with --resume {run_dir}")
    atomic.remove_temporaries(ckpt_dir)  # left by a killed run; we hold the lock
    if restart:
        _start_over(run_dir)
    if origin.resumed:
        # What the run did after the resumed step is a future this run no longer has: moved aside, never deleted.
        step = origin.invocation["from_step"]
        guard = (origin.source.get("callbacks") or {}).get("RunGuard") or {}
        best_step = guard.get("best_step") if isinstance(guard.get("best_step"), int) else None
        moved = set_aside(run_dir, step=step, resumed=origin.checkpoint, best_step=best_step)
        if moved.folder is not None:
            origin.invocation["set_aside"] = str(moved.folder.relative_to(run_dir))
            _say(moved.line(step))

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
        _say(
            f"{display_path(run_dir)} stopped before its first checkpoint: starting over; its metrics were kept as {kept.name}"
        )
    empty = run_dir / "checkpoints"
    if empty.is_dir() and is_empty(empty):
        empty.rmdir()


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
    accelerated = _accelerated(recipe)
    workers = recipe.data.workers
    if workers == "auto":
        workers = min(4, max(1, (os.cpu_count() or 2) // 2)) if accelerated else 0
    datamodule = DataModule(
        prepared,
        recipe.data,
        seed=recipe.trainer.seed,
        workers=workers,
        pin_memory=accelerated,
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
        per_epoch = datamodule.sampler("train", train=True).batches_per_epoch // _world(recipe) or 1
        max_steps = min(max_steps, math.ceil(t.max_epochs * per_epoch / recipe.optim.accumulate))
    # On an accelerator the display reads the loss back (a sync) only every log_every steps.
    threads = devices.threads(t.threads)
    torch.set_num_threads(threads)
    shown = Progress(
        run_dir=display_path(run_dir),
        every=t.log_every,
        read_every=t.log_every if accelerated else 1,
        quiet=not t.progress,
        detail=f"{threads} CPU thread{'s' if threads > 1 else ''} (trainer.threads: {t.threads})",
    )
    callbacks: list[Callback] = [guard, shown] + ([StepHook(on_step)] if on_step else []) + start.callbacks
    built = loggers.build(recipe, run_dir)  # metrics.csv first, always
    metrics_to = built + start.loggers
    trainer = _trainer(recipe, run_dir, callbacks, max_steps, metrics_to)
    if trainer.is_global_zero:
        loggers.start(
            metrics_to, recipe, run_dir
        )  # before the first step: a tracker that cannot start stops the run here
    ours = RUN_DIR_ENV not in os.environ
    os.environ[RUN_DIR_ENV] = str(run_dir)  # inherited by the processes a DDP launcher starts
    gpu = accelerated and torch.cuda.is_available()
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
        name = signal_name(guard.signum)
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


signal_name = stopping.name


__all__ = ["Interrupted", "NonFiniteLoss", "Summary", "Task", "fit"]
