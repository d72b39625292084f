"""What a training run shows while it runs: one line that states the truth (and :func:`say`, a line from start-up).

``step 1,200/3,000  loss 2.345  1.8e+03 tok/s  lr 4.0e-04  val_loss 2.101  eta 0:14:05``

- The total is the step the run will really stop at: ``trainer.max_steps`` (or the step
  ``trainer.max_epochs`` comes to), or, when ``trainer.max_minutes`` will stop the run first,
  the step the current pace reaches by then, shown as ``~N (time limit)``; the ETA follows the same rule.
- Steps are optimizer steps of the whole run: a resumed run continues its count.
- In a terminal the line is redrawn in place (at most a few times a second); otherwise (a batch job,
  ``nohup``, a pipe) one plain line is written every ``trainer.log_every`` steps. Every validation
  adds a line of its own, and the run directory is named before the first step.
- On an accelerator the loss is read back (a host-device sync) only every ``log_every`` steps.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, Timer

from tfbuilder.train.shown import FORMATS, show

REDRAW_SECONDS = 0.25  # a terminal line is redrawn at most this often


def global_rank() -> int:
    """This process's rank among a run's processes (0 when it runs alone), as Lightning records it."""
    # Lightning sets `rank` on the function at import; its overloaded signature does not declare it.
    return rank_zero_only.rank  # type: ignore[attr-defined]


def say(line: str) -> None:
    """One line on the terminal from the first process (what the data preparation or the start-up did)."""
    if global_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def scientific(value: float) -> str:
    """``0.0004`` -> ``4.0e-04``: a learning rate stays readable at every scale (never ``0.000``)."""
    return f"{value:.1e}"


def clock(seconds: float) -> str:
    """``3725`` -> ``1:02:05``."""
    seconds = max(int(round(seconds)), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Pace:
    """Seconds per step over the steps of this invocation (validations included: they take wall time too)."""

    def __init__(self) -> None:
        self.first_step: int | None = None
        self.first_time = 0.0

    def note(self, step: int, now: float) -> None:
        if self.first_step is None:
            self.first_step, self.first_time = step, now

    def seconds_per_step(self, step: int, now: float) -> float | None:
        if self.first_step is None or step <= self.first_step:
            return None
        return (now - self.first_time) / (step - self.first_step)


def forecast(step: int, max_steps: int, per_step: float | None, time_left: float | None) -> tuple[str, float | None]:
    """The total to show and the seconds left: whichever of the step and time limits comes first."""
    steps_eta = (max_steps - step) * per_step if per_step is not None else None
    if time_left is not None and (steps_eta is None or time_left < steps_eta):
        if per_step is None:
            return f"{max_steps:,}", max(time_left, 0.0)
        reach = min(max_steps, step + max(int(time_left / per_step), 0))
        return f"~{reach:,} (time limit)", max(time_left, 0.0)
    return f"{max_steps:,}", steps_eta


class Progress(Callback):
    """Prints the run's state to ``stream`` (standard error by default); see the module docstring.

    ``live``: ``True`` redraws one line in place, ``False`` prints a line every ``every`` steps, and
    ``None`` chooses by whether ``stream`` is a terminal. ``quiet`` keeps only the start line and
    the validation lines; ``detail`` ends the start line."""

    def __init__(
        self,
        *,
        run_dir: str,
        every: int,
        read_every: int = 1,
        stream: TextIO | None = None,
        live: bool | None = None,
        quiet: bool = False,
        detail: str = "",
    ):
        self.run_dir = run_dir
        self.detail = detail
        self.every = every
        self.read_every = read_every
        self.stream = stream
        self.live = live
        self.quiet = quiet
        self.pace = Pace()
        self.loss: float | None = None
        self.validation = ""
        self.last_draw = 0.0
        self.last_step = -1  # with gradient accumulation several batches end on one step
        self.width = 0

    # --- output -------------------------------------------------------------------------------
    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    @property
    def interactive(self) -> bool:
        if self.live is not None:
            return self.live
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty())

    def say(self, text: str) -> None:
        """A line that stays (in a terminal: above the live line)."""
        if self.interactive and self.width:
            self.out.write("\r" + " " * self.width + "\r")
            self.width = 0
        self.out.write(text + "\n")
        self.out.flush()

    def draw(self, text: str) -> None:
        self.out.write("\r" + text + " " * max(self.width - len(text), 0))
        self.out.flush()
        self.width = len(text)

    # --- what is shown ------------------------------------------------------------------------
    def line(self, trainer: L.Trainer, now: float, note: str = "") -> str:
        step = trainer.global_step
        total, left = forecast(step, trainer.max_steps, self.pace.seconds_per_step(step, now), _time_left(trainer))
        fields = [f"step {step:,}/{total}"]
        if self.loss is not None:
            fields.append(f"loss {self.loss:.3f}")
        metrics = trainer.callback_metrics
        if "tokens_per_s" in metrics:
            fields.append(f"{scientific(float(metrics['tokens_per_s']))} tok/s")
        if "lr" in metrics:
            fields.append(f"lr {scientific(float(metrics['lr']))}")
        if self.validation:
            fields.append(self.validation)
        fields.append("eta " + (clock(left) if left is not None else "?"))
        if note:
            fields.append(note)
        return "  ".join(fields)

    # --- hooks --------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        begin = f"from step {step:,}" if step else "from step 0"
        self.say(f"run directory: {self.run_dir}")
        self.say(
            f"training {begin} to at most {trainer.max_steps:,} steps"
            + _limit(trainer)
            + (f"; {self.detail}" if self.detail else "")
        )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero or self.quiet:
            return
        now = time.monotonic()
        step = trainer.global_step
        if step == self.last_step:
            return
        self.last_step = step
        self.pace.note(step, now)
        if step % self.read_every == 0 or self.loss is None:
            loss = trainer.callback_metrics.get("train_loss")
            if loss is not None:
                self.loss = float(loss)  # one read every read_every steps (a sync on accelerators)
        if self.interactive:
            if now - self.last_draw >= REDRAW_SECONDS or step >= trainer.max_steps:
                self.draw(self.line(trainer, now))
                self.last_draw = now
        elif step % self.every == 0:
            self.say(self.line(trainer, now))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self.interactive and not self.quiet and not trainer.sanity_checking:
            self.draw(self.line(trainer, time.monotonic(), note="validating"))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        shown = {name: f"{name} {show(name, float(metrics[name]))}" for name in FORMATS if name in metrics}
        self.validation = "  ".join(shown[name] for name in ("val_loss", "val_bleu") if name in shown)
        self.say(f"validation at step {trainer.global_step:,}: " + ", ".join(shown.values()))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self.interactive and self.width:
            self.out.write("\n")
            self.out.flush()
            self.width = 0


def _timer(trainer: L.Trainer) -> Timer | None:
    # Lightning makes the Timer of trainer.max_time itself; `callbacks` is set on the Trainer from outside
    # its class (by its callback connector), so the class does not declare it.
    callbacks = trainer.callbacks  # type: ignore[attr-defined]
    return next((c for c in callbacks if isinstance(c, Timer)), None)


def _time_left(trainer: L.Trainer) -> float | None:
    timer = _timer(trainer)
    return timer.time_remaining() if timer is not None else None


def _limit(trainer: L.Trainer) -> str:
    left = _time_left(trainer)
    if left is None or math.isinf(left):
        return ""
    return f" or for {clock(left)} (trainer.max_minutes), whichever comes first"


__all__ = ["Pace", "Progress", "clock", "forecast", "scientific"]
