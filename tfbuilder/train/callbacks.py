"""The Lightning side of a run you can trust (:mod:`tfbuilder.train` lists the modules that import Lightning).

- :class:`AtomicCheckpointIO` writes every checkpoint atomically and never writes non-finite weights.
- :class:`RunGuard` checkpoints at every validation (``last.ckpt`` is always the latest validated
  state, ``best.ckpt`` the best by ``trainer.monitor``, the ``keep_last`` most recent kept as
  ``step-<n>.ckpt``), stops early after ``patience`` validations without improvement, stops on a
  non-finite loss without a host sync per step, validates the final step, and turns Ctrl-C / SIGTERM
  into a last validated checkpoint and a clean stop.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback

from tfbuilder import atomic
from tfbuilder.errors import TfbuilderError
from tfbuilder.runs import sharded
from tfbuilder.runs.checkpoints import STEP_PREFIX, step_checkpoints
from tfbuilder.train import stopping


@runtime_checkable
class FiniteWatch(Protocol):
    """What the callbacks read of the Task (task.py and trainer.py import this module, not the reverse):
    ``bad_step``, a device tensor holding the first step whose loss was not finite (0: none), or None."""

    bad_step: torch.Tensor | None


class NonFiniteLoss(TfbuilderError):
    """Training produced a NaN or infinite loss (exit 1: the input was fine, the run diverged)."""

    exit_code = 1


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of floating-point tensors holding a NaN or an infinity."""
    floats = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if not floats:
        return []
    # One reduction per tensor, one host read in all: this runs only when a checkpoint is written.
    finite = torch.stack([torch.isfinite(v).all().cpu() for v in floats.values()])
    return [k for k, ok in zip(floats, finite.tolist(), strict=True) if not ok]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file beside the target, fsync, rename: a crash or a full disk
    leaves the previous checkpoint whole. A model with a non-finite weight is never written."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        bad = non_finite(checkpoint.get("state_dict", {}))
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise NonFiniteLoss(
                f"the weights became non-finite by step {checkpoint.get('global_step')} ({shown}); training stopped "
                "and they were not saved. Lower the learning rate or set optim.grad_clip."
            )
        atomic.save(checkpoint, Path(path))


class RunGuard(Callback):
    """Checkpoints, monitor, patience, divergence, the final validation, and signals (see the module)."""

    def __init__(self, ckpt_dir: Path, *, monitor: str, patience: int | None, keep_last: int, log_every: int):
        self.ckpt_dir = Path(ckpt_dir)
        self.monitor = monitor
        self.mode = "max" if monitor in ("val_bleu", "val_acc", "val_f1") else "min"
        self.patience = patience
        self.keep_last = keep_last
        self.log_every = log_every
        # Carried across resumes (state_dict):
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.best_val_loss: float | None = None
        self.last_step: int | None = None  # step of the last validation (= of last.ckpt)
        self.last_metrics: dict[str, float] = {}
        self.stale = 0  # validations since the last improvement
        self.kept_step: int | None = None  # step of the checkpoint last.ckpt holds on disk
        # This invocation only:
        self.stopped: str | None = None
        self.record: dict = {}  # this invocation's history entry (saved in checkpoints): says why it stopped
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._checked = -1

    # --- state carried in every checkpoint ----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        keys = ("monitor", "best_score", "best_step", "best_val_loss", "last_step", "last_metrics", "stale")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kept_step = state.get("last_step")
        if state.get("monitor", self.monitor) != self.monitor:
            return  # a changed monitor starts its own record (the old best is not comparable)
        for k in ("best_score", "best_step", "best_val_loss", "last_step", "stale"):
            setattr(self, k, state.get(k))
        self.stale = int(self.stale or 0)
        self.last_metrics = dict(state.get("last_metrics") or {})

    # --- signals --------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in stopping.SIGNALS:
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt  # the second time: stop at once
        self.signum = signum
        name = signal.Signals(signum).name
        print(
            f"\n{name}: stopping after validating and checkpointing the current step ({name} again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    # --- training steps ---------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        distributed = trainer.world_size > 1
        due = step % self.log_every == 0 and step != self._checked  # once per step, not per accumulated batch
        if due:
            self._checked = step
            self.check_finite(trainer, pl_module)
        stop = self.signum is not None
        if distributed and due:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        elif distributed:
            stop = False  # every rank must stop at the same step: decided at log_every steps only
        if stop and not trainer.should_stop:
            self.stop(trainer, "interrupted")  # Lightning validates once more before stopping (our checkpoint)
        if step >= trainer.max_steps and self.last_step != step:
            self.record.setdefault("stopped", "max_steps")
            trainer.should_stop = True  # the run ends on a validated checkpoint of its last step

    def stop(self, trainer: L.Trainer, why: str) -> None:
        self.stopped = self.record["stopped"] = why
        trainer.should_stop = True

    def check_finite(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read the first non-finite step (a device tensor the task updates without syncing)."""
        bad = pl_module.bad_step if isinstance(pl_module, FiniteWatch) else None
        if bad is None:
            return
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            bad = bad.clone()
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        first = int(bad)  # the one host sync, every log_every steps and before every checkpoint
        if first:
            raise NonFiniteLoss(
                f"the loss became non-finite at step {first}; training stopped. {self.kept()} "
                "Lower the learning rate or set optim.grad_clip."
            )

    def kept(self) -> str:
        if self.kept_step is None:
            return "No checkpoint was written."
        return f"checkpoints/last.ckpt holds step {self.kept_step}, the last validated state."

    # --- validation: the checkpoint -----------------------------------------------------------------
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        step = trainer.global_step
        self.check_finite(trainer, pl_module)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
        loss = metrics.get("val_loss")
        if loss is not None and not math.isfinite(loss):
            raise NonFiniteLoss(
                f"the validation loss became {loss} at step {step}; training stopped. {self.kept()} "
                "Lower the learning rate or set optim.grad_clip."
            )
        score = metrics.get(self.monitor)
        improved = score is not None and (
            self.best_score is None or (score < self.best_score if self.mode == "min" else score > self.best_score)
        )
        if improved:
            self.best_score, self.best_step, self.stale = score, step, 0
        elif self.last_step != step:
            self.stale += 1
        if loss is not None and (self.best_val_loss is None or loss < self.best_val_loss):
            self.best_val_loss = loss
        self.last_step, self.last_metrics = step, metrics
        if self.patience is not None and self.stale >= self.patience:
            self.stop(
                trainer,
                f"early stopping: {self.monitor} did not improve for {self.stale} validations "
                f"(patience {self.patience})",
            )
        if self.signum is not None:
            self.stop(trainer, "interrupted")
        self.save(trainer, step, improved=improved)

    def save(self, trainer: L.Trainer, step: int, *, improved: bool) -> None:
        """One write (``step-<n>.ckpt``), then hard links: best first, last second, so that a crash
        between them never leaves a ``best.ckpt`` older than the best that ``last.ckpt`` records."""
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        written = self.ckpt_dir / f"{STEP_PREFIX}{step:08d}.ckpt"
        trainer.save_checkpoint(written, weights_only=False)
        if not trainer.is_global_zero:
            return
        link = sharded.link_folder if written.is_dir() else atomic.link  # a folder under fsdp
        if improved:
            link(written, self.ckpt_dir / "best.ckpt")
        link(written, self.ckpt_dir / "last.ckpt")
        self.kept_step = step
        kept = step_checkpoints(self.ckpt_dir)
        for _, old in kept[: max(len(kept) - self.keep_last, 0)]:
            sharded.remove(old)
