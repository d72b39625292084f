"""What ``fit`` reports when it ends: :class:`Summary`, printed by ``tfbuilder fit`` and kept as ``summary.json``."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tfbuilder import atomic
from tfbuilder.runs import steps as numbering
from tfbuilder.runs.checkpoints import display_path
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train import memory
from tfbuilder.train.shown import show
from tfbuilder.train.task import Task
from tfbuilder.train.trainer import Training

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
    metrics_steps: str = numbering.LIGHTNING  # how metrics.csv numbers its rows (tfbuilder.runs.steps)
    last_train_loss: float | None = None  # as last logged: on several processes, the mean over all ranks

    @classmethod
    def of(cls, recipe: Recipe, training: Training, task: Task) -> Summary:
        """What ``training`` of ``task`` did (the run's whole history, earlier invocations included)."""
        guard, steps = training.guard, training.trainer.global_step
        ckpt_dir = training.run_dir / "checkpoints"
        best = ckpt_dir / "best.ckpt"
        return cls(
            run_dir=str(training.run_dir),
            steps=steps,
            seconds=task.elapsed(),
            best_val_loss=guard.best_val_loss,
            best_val_ppl=math.exp(min(guard.best_val_loss, 50)) if guard.best_val_loss is not None else None,
            best_checkpoint=str(best) if best.exists() and guard.best_step is not None else None,
            last_checkpoint=str(ckpt_dir / "last.ckpt"),
            tokens_per_s=task.all_ranks[1] if task.all_ranks else task.train_tokens / max(task.train_seconds, 1e-9),
            ranks_agree=task.ranks_agree,
            last_val_acc=guard.last_metrics.get("val_acc"),
            train_tokens=task.all_ranks[0] if task.all_ranks else task.train_tokens,
            last_val_bleu=guard.last_metrics.get("val_bleu"),
            monitor=guard.monitor,
            best_score=guard.best_score,
            best_step=guard.best_step,
            last_val_step=guard.last_step,
            stopped=training.stopped,
            history=task.history + [{**task.invocation, "to_step": steps}],
            peak_memory_mb=memory.peak_mb(training.gpu),
            metrics_steps=task.metrics_steps,
            last_train_loss=None if task.last_train_loss is None else float(task.last_train_loss),
            head_scores=None
            if recipe.model.head is None
            else {
                k: v
                for k, v in guard.last_metrics.items()
                if k in SCORE_NAMES and math.isfinite(v)  # Pearson's r of a constant: none
            },
        )

    def write(self, run_dir: Path) -> None:
        """Write ``summary.json`` (atomically, through :mod:`tfbuilder.atomic`)."""
        atomic.write_text(run_dir / "summary.json", json.dumps(asdict(self), indent=2), what="summary")

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
            rows += [(f"last validation {SCORE_NAMES[k]}", show(k, v)) for k, v in self.head_scores.items()]
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
                    f"{display_path(self.best_checkpoint)} "
                    f"(step {self.best_step}, {self.monitor} {self.best_score:.4f})",
                )
            )
        else:
            rows.append(("best checkpoint", "n/a"))
        rows.append(("last checkpoint", f"{display_path(self.last_checkpoint)} (step {self.last_val_step})"))
        if self.ranks_agree is not None:
            rows.append(("ranks agree", "yes" if self.ranks_agree else "NO"))
        width = max(len(k) for k, _ in rows)
        return [f"{k.ljust(width)}  {v}" for k, v in rows]
