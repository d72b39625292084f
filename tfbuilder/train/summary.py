"""What ``fit`` reports when it ends: :class:`Summary`, printed by ``tfbuilder fit`` and kept as ``summary.json``."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfbuilder.runs.checkpoints import display_path


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
