"""Training through Lightning: the LightningModule, the Trainer it is given, and :func:`fit`.

The model stays a plain ``nn.Module``; this module is the only one (with the CLI) that imports Lightning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from . import __version__, objectives, preflight
from .builder import build_model
from .data.datamodule import DataModule
from .data.prepare import Vocab, prepare
from .errors import TfbuilderError
from .metrics_log import MetricsCSV
from .recipe import Recipe
from .runs import RUN_DIR_ENV, RunDirError, new_run_dir, read_checkpoint, write_recipe
from .schedules import learning_rate

log = logging.getLogger("tfbuilder")


class NonFiniteLoss(TfbuilderError):
    """Training produced a NaN or infinite loss (exit 1: the input was fine, the run diverged)."""

    exit_code = 1


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
        kind = recipe.model.kind
        eps = recipe.optim.label_smoothing
        if kind == "encoder_decoder":
            self.objective = partial(objectives.seq2seq, epsilon=eps)
        elif kind == "decoder":
            self.objective = partial(objectives.causal_lm, epsilon=eps)
        else:
            self.objective = partial(
                objectives.masked_lm, epsilon=eps, probability=recipe.data.mlm_probability, vocab_size=recipe.model.vocab_size
            )
        self._val = torch.zeros(3, dtype=torch.float64)
        self._clock = 0.0
        self._tokens_per_s = 0.0
        self.ranks_agree: bool | None = None
        self._routed = [m for m in model.modules() if hasattr(m, "aux_loss") and hasattr(m, "aux_weight")]

    # --- training -----------------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        torch.manual_seed(batch_seed(self.recipe.trainer.seed, self.batches_seen, self.global_rank))
        self._clock = time.perf_counter()

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        result = self.objective(self.model, batch)
        if self._routed:  # mixture-of-experts layers add their load-balancing losses
            aux = sum(m.aux_weight * m.aux_loss for m in self._routed)
            self.log("moe_aux_loss", aux, batch_size=result.tokens)
            result.loss = result.loss + aux
        if not torch.isfinite(result.loss):
            raise NonFiniteLoss(
                f"the loss became {result.loss.item()} at step {self.global_step + 1}; training stopped "
                "(the last good checkpoint is kept). Lower the learning rate or set optim.grad_clip."
            )
        self._batch_tokens = result.tokens
        size = result.tokens
        self.log("train_loss", result.loss, prog_bar=True, batch_size=size)
        self.log("train_ppl", torch.exp(result.nll / max(size, 1)), batch_size=size)
        self.log("train_acc", result.correct.float() / max(size, 1), batch_size=size)
        return result.loss

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
        self._val = torch.zeros(3, dtype=torch.float64)

    def validation_step(self, batch, batch_idx: int) -> None:
        result = self.objective(self.model, batch)
        self._val += torch.tensor([result.nll.item(), result.correct.item(), result.tokens], dtype=torch.float64)

    def on_validation_epoch_end(self) -> None:
        nll, correct, tokens = self.trainer.strategy.reduce(self._val.to(self.device), reduce_op="sum").tolist()
        loss = nll / max(tokens, 1)
        self.log("val_loss", loss, prog_bar=True, sync_dist=False, rank_zero_only=False)
        self.log("val_ppl", math.exp(min(loss, 50)), sync_dist=False)
        self.log("val_acc", correct / max(tokens, 1), sync_dist=False)
        if self.bleu_lines is not None:
            self.log("val_bleu", self.validation_bleu(), sync_dist=False)

    def validation_bleu(self) -> float:
        """sacreBLEU of greedy translations of ``bleu_lines`` (every rank computes the same score)."""
        import sacrebleu

        from .evaluation import translate

        sources, references = self.bleu_lines
        hypotheses = list(translate(self.model, self.vocab, sources, beam=1))
        self.model.train(self.training)
        return sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score

    # --- optimisation ---------------------------------------------------------------------------
    def configure_optimizers(self):
        optim, trainer = self.recipe.optim, self.recipe.trainer
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        groups = [
            {"params": decay, "weight_decay": optim.weight_decay if optim.optimizer == "adamw" else 0.0},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        cls = torch.optim.AdamW if optim.optimizer == "adamw" else torch.optim.Adam
        # The fused kernel is one pass over all parameters: several times faster than the default on CPU.
        optimizer = cls(groups, lr=1.0, betas=optim.betas, eps=optim.eps, fused=True)
        rate = learning_rate(optim.schedule, d_model=self.recipe.model.d_model, lr=optim.lr, max_steps=trainer.max_steps)
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
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint["tfbuilder"]
        self.batches_seen = int(saved["batches_seen"])
        self.train_tokens = int(saved.get("train_tokens", 0))
        self.train_seconds = float(saved.get("train_seconds", 0.0))
        self.elapsed_before = float(saved.get("elapsed", 0.0))

    def on_train_end(self) -> None:
        if self.trainer.world_size > 1:
            # Every rank must end with the same weights; check it rather than assume it.
            digest = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).sum().reshape(1)
            gathered = self.all_gather(digest.to(self.device)).flatten()
            self.ranks_agree = bool(torch.all(gathered == gathered[0]))


class SaveLast(Callback):
    """Writes ``last.ckpt`` when training ends normally (max_steps, max_epochs, max_minutes)."""

    def __init__(self, path: Path):
        self.path = path

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)


@dataclass
class Summary:
    """What ``fit`` reports when it ends."""

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

    def lines(self) -> list[str]:
        best = "n/a" if self.best_val_loss is None else f"{self.best_val_loss:.4f} (perplexity {self.best_val_ppl:.2f})"
        rows = [
            ("run directory", self.run_dir),
            ("steps", f"{self.steps:,}"),
            ("wall time", f"{self.seconds:.1f} s"),
            ("best validation loss", best),
            ("last validation accuracy", "n/a" if self.last_val_acc is None else f"{self.last_val_acc:.2%} of target tokens"),
        ]
        if self.last_val_bleu is not None:
            rows.append(("last validation BLEU", f"{self.last_val_bleu:.2f} (greedy, subset)"))
        rows += [
            ("tokens/s (training steps)", f"{self.tokens_per_s:,.0f} (mean of {self.train_tokens:,} target tokens)"),
            ("best checkpoint", self.best_checkpoint or "n/a"),
            ("last checkpoint", self.last_checkpoint),
        ]
        if self.ranks_agree is not None:
            rows.append(("ranks agree", "yes" if self.ranks_agree else "NO"))
        width = max(len(k) for k, _ in rows)
        return [f"{k.ljust(width)}  {v}" for k, v in rows]


def _world(recipe: Recipe) -> int:
    devices = recipe.trainer.devices
    if devices == "auto":
        devices = torch.cuda.device_count() if recipe.trainer.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else 1
    return max(1, int(devices)) * recipe.trainer.num_nodes


def _trainer(recipe: Recipe, run_dir: Path, callbacks: list[Callback], max_steps: int) -> L.Trainer:
    t, optim = recipe.trainer, recipe.optim
    logger_args = {"save_dir": str(run_dir.parent.parent), "name": run_dir.parent.name, "version": run_dir.name}
    if t.logger == "tensorboard":
        try:
            from lightning.pytorch.loggers import TensorBoardLogger

            logger = TensorBoardLogger(**logger_args, default_hp_metric=False)
        except ModuleNotFoundError as exc:
            raise TfbuilderError(f"trainer.logger: tensorboard needs the tensorboard package ({exc})") from None
    else:
        logger = MetricsCSV(run_dir)
    try:
        return L.Trainer(
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
            enable_progress_bar=t.progress,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,  # the bucketing sampler splits batches across ranks itself
            logger=logger,
            callbacks=callbacks,
            default_root_dir=str(run_dir),
        )
    except (ValueError, RuntimeError) as exc:  # e.g. a precision or accelerator this machine lacks
        raise TfbuilderError(f"trainer: {exc}") from None


class StepHook(Callback):
    """Calls ``hook(step, max_steps)`` after every optimizer step (progress displays)."""

    def __init__(self, hook: Callable[[int, int], None]):
        self.hook = hook

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self.hook(trainer.global_step, trainer.max_steps)


def fit(
    recipe: Recipe,
    *,
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> Summary:
    """Train ``recipe`` (or continue the run a checkpoint or run directory belongs to).

    ``run_dir`` trains into that directory (created if needed; refused if it already holds a run)
    instead of a new ``<output>/<name>/version_<n>``; ``on_step(step, max_steps)`` is called after
    every optimizer step."""
    if recipe.data is None:
        raise TfbuilderError("the recipe has no data section: nothing to train on")
    preflight.check_run(recipe)  # builds, steps and fits this machine, before any run directory exists
    start = time.perf_counter()
    ckpt_path = None
    if resume is not None:
        from .runs import find_checkpoint

        ckpt_path = find_checkpoint(resume)
        read_checkpoint(ckpt_path)  # a damaged checkpoint is reported before anything starts
        run_dir = ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else ckpt_path.parent
    elif run_dir is not None or os.environ.get(RUN_DIR_ENV):
        # One directory for every process of a job: set by rank 0 for the processes it launches,
        # or by the user for a cluster launcher (torchrun, SLURM) that starts all ranks at once.
        run_dir = Path(run_dir if run_dir is not None else os.environ[RUN_DIR_ENV])
        if rank_zero_only.rank == 0:
            if (run_dir / "checkpoints").exists():
                raise RunDirError(f"{run_dir} already holds a run: resume it with --resume {run_dir}")
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunDirError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
        else:
            _wait_for(run_dir / "tokenizer.json")
    vocab_file = run_dir / "tokenizer.json" if run_dir is not None else None
    vocab = Vocab.from_json(vocab_file.read_text(encoding="utf-8")) if vocab_file and vocab_file.exists() else None
    # All data problems surface here, before a run directory exists or anything trains.
    prepared = prepare(recipe.data, vocab=vocab, model_vocab=recipe.model.vocab_size)
    preflight.check_split_lengths(recipe, prepared.splits)
    vocab_json = prepared.vocab.to_json()
    if run_dir is None:
        run_dir = new_run_dir(recipe.trainer.output, recipe.name)
    if rank_zero_only.rank == 0:
        if not (run_dir / "tokenizer.json").exists():
            (run_dir / "tokenizer.json").write_text(vocab_json, encoding="utf-8")
        if not (run_dir / "recipe.yaml").exists():  # a resumed run keeps the recipe it started with
            write_recipe(run_dir, recipe.to_dict())

    L.seed_everything(recipe.trainer.seed, workers=True, verbose=False)
    model = build_model(recipe)
    if recipe.trainer.compile:
        model.features = torch.compile(model.features)
    bleu_lines = None
    if recipe.trainer.val_bleu:
        sources, references = prepared.raw["val"]
        bleu_lines = (sources[: recipe.trainer.val_bleu], references[: recipe.trainer.val_bleu])
    task = Task(recipe, model, vocab_json, vocab=prepared.vocab, bleu_lines=bleu_lines, started=start)
    datamodule = DataModule(prepared, recipe.data, seed=recipe.trainer.seed)
    datamodule.position_source = lambda: task.batches_seen

    ckpt_dir = run_dir / "checkpoints"
    best = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val_loss", mode="min", save_last=True, enable_version_counter=False)
    max_steps = recipe.trainer.max_steps
    if recipe.trainer.max_epochs:
        per_epoch = datamodule._sampler("train", train=True).batches_per_epoch // _world(recipe) or 1
        max_steps = min(max_steps, math.ceil(recipe.trainer.max_epochs * per_epoch / recipe.optim.accumulate))
    last = ckpt_dir / "last.ckpt"
    callbacks: list[Callback] = [best, SaveLast(last)] + ([StepHook(on_step)] if on_step else [])
    trainer = _trainer(recipe, run_dir, callbacks, max_steps)
    ours = RUN_DIR_ENV not in os.environ
    os.environ[RUN_DIR_ENV] = str(run_dir)  # inherited by the processes a DDP launcher starts
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path else None, weights_only=True)
    finally:
        if ours:
            os.environ.pop(RUN_DIR_ENV, None)

    score = best.best_model_score
    best_loss = float(score) if score is not None else None
    summary = Summary(
        run_dir=str(run_dir),
        steps=trainer.global_step,
        seconds=task.elapsed(),
        best_val_loss=best_loss,
        best_val_ppl=math.exp(min(best_loss, 50)) if best_loss is not None else None,
        best_checkpoint=best.best_model_path or None,
        last_checkpoint=str(last),
        tokens_per_s=task.train_tokens / max(task.train_seconds, 1e-9),
        ranks_agree=task.ranks_agree,
        last_val_acc=_metric(trainer, "val_acc"),
        train_tokens=task.train_tokens,
        last_val_bleu=_metric(trainer, "val_bleu"),
    )
    if trainer.is_global_zero:
        (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2), encoding="utf-8")
    return summary


def _metric(trainer: L.Trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name)
    return None if value is None else float(value)


def _wait_for(path: Path, seconds: float = 600.0) -> None:
    """Ranks other than 0 wait for rank 0 to write the vocabulary."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TfbuilderError(f"rank {rank_zero_only.rank}: gave up waiting for {path} from rank 0")
        time.sleep(0.2)
