"""The LightningModule that optimises a tfbuilder model: the recipe's objective, its optimizer and schedule,
the metrics of training and validation, and what a checkpoint carries beyond the weights (:class:`Task`).

The model stays a plain ``nn.Module`` (:mod:`tfbuilder.train` lists the modules that import Lightning).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch

from tfbuilder import registry
from tfbuilder.data import batching
from tfbuilder.data.prepare import Prepared, Vocab
from tfbuilder.errors import DataError
from tfbuilder.inference.translate import translate
from tfbuilder.model.model import Model
from tfbuilder.runs import steps as numbering
from tfbuilder.spec.recipe import Recipe
from tfbuilder.train import objectives, sharding
from tfbuilder.train.heads import metrics as head_metrics
from tfbuilder.train.optimizers import build_optimizer
from tfbuilder.train.schedules import learning_rate
from tfbuilder.version import __version__


def batch_seed(seed: int, position: int, rank: int) -> int:
    """The seed of one training batch: dropout and masking depend only on (seed, batch, rank), so a
    resumed run draws exactly what an uninterrupted one would."""
    return (seed * 0x9E3779B1 + position * 0x85EBCA77 + rank * 0xC2B2AE3D) % (2**63 - 1)


class Task(L.LightningModule):
    """Optimises a tfbuilder model on the recipe's objective; logs loss, perplexity, accuracy, lr, tokens/s."""

    def __init__(
        self,
        recipe: Recipe,
        model: Model,
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
        self.batches_seen = 0  # training batches this rank consumed over the whole run
        # The global data position this invocation started from, and batches_seen then: with the
        # batches per epoch (set by the data module) they give the position now (data_position).
        self.data_start: batching.Position = (0, 0)
        self.batches_at_start = 0
        self.batches_in_epoch: Callable[[], int] = lambda: 1
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
        self.all_ranks: tuple[int, float] | None = None  # (target tokens, tokens/s) over every rank, at the end
        self.last_train_loss: torch.Tensor | None = None  # train_loss as last logged (on the device)
        self.bad_step: torch.Tensor | None = None  # first step with a non-finite loss (0: none)
        self._window_tokens: torch.Tensor | int = 0  # target tokens of the micro-batches since the last step
        self.run_dir: str | None = None  # recorded in checkpoints: a resume elsewhere is refused
        self.history: list[dict] = []  # earlier invocations (from the resumed checkpoint)
        self.invocation: dict = {}  # this invocation's record; its to_step follows the checkpoints
        self.metrics_steps = numbering.OPTIMIZER  # how metrics rows are numbered (a resumed older run: its own)

    @classmethod
    def for_run(
        cls, recipe: Recipe, model: Model, prepared: Prepared, *, run_dir: Path, invocation: dict, started: float
    ) -> Task:
        """The task of a fit in ``run_dir``: validation BLEU on the first ``trainer.val_bleu`` validation
        lines, this invocation's record, the objective compiled when ``trainer.compile`` asks."""
        bleu_lines = None
        if recipe.trainer.val_bleu:
            sources, references = prepared.raw["val"]
            if references is None:
                raise DataError("trainer.val_bleu: the val split has no reference translations to score against")
            bleu_lines = (sources[: recipe.trainer.val_bleu], references[: recipe.trainer.val_bleu])
        vocab_json = prepared.vocab.to_json()
        task = cls(recipe, model, vocab_json, vocab=prepared.vocab, bleu_lines=bleu_lines, started=started)
        task.run_dir = str(run_dir.resolve())
        task.invocation = invocation
        if recipe.trainer.compile:
            # Features and the fused loss as one graph (tested to have no breaks for every built-in
            # component); varying batch shapes are traced as dynamic after the first change.
            task.objective = torch.compile(task.objective)
        return task

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
        self.log_train_loss(result.loss, result.tokens, size)
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

    def log_train_loss(self, loss: torch.Tensor, tokens: torch.Tensor, size: int) -> None:
        """Log ``train_loss``, a mean over the batch's predicted ``tokens``. On several processes it is the
        token-weighted mean over all ranks' batches (the loss of one batch made of them all), reduced only
        on the steps whose metrics reach the loggers (every ``trainer.log_every`` steps, and the last): a
        collective on the device, no host sync, and none on the other steps."""
        # No process group: one process (or a step driven without a Trainer, as tests do).
        several = torch.distributed.is_available() and torch.distributed.is_initialized()
        if not several or torch.distributed.get_world_size() == 1:
            self.last_train_loss = loss.detach()
            self.log("train_loss", loss, prog_bar=True, batch_size=size)
            return
        step = self.global_step + 1  # every rank agrees on it: all take part in the reduction or none
        if step % self.recipe.trainer.log_every and step != self.trainer.max_steps:
            return
        weighted = torch.stack([loss.detach().double() * tokens, tokens.double()])
        total, count = self.trainer.strategy.reduce(weighted, reduce_op="sum")
        self.last_train_loss = total / count.clamp(min=1)
        self.log("train_loss", self.last_train_loss.float(), prog_bar=True, batch_size=size, sync_dist=False)

    def on_before_optimizer_step(self, optimizer) -> None:
        # Once per optimizer step, after every micro-batch's forward: routing biases move by the step's
        # load on all ranks (outside the forward, which would update per micro-batch and per rank, and
        # outside the compiled objective; a device collective, no host sync).
        self.model.balance_routing(self._sum_over_ranks if self.trainer.world_size > 1 else None)
        if self.recipe.optim.accumulate == 1:
            return
        tokens = torch.as_tensor(self._window_tokens, dtype=torch.float64, device=self.device)
        self._window_tokens = 0
        world = self.trainer.world_size
        if world > 1:  # every rank divides by the same count: the tokens of the step on all ranks
            tokens = self.trainer.strategy.reduce(tokens, reduce_op="sum")
        # The gradients are the sum over the window divided by k (Lightning), averaged over ranks.
        scale = self.trainer.accumulate_grad_batches * world / tokens.clamp(min=1)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, scale.to(grads[0].dtype))

    def data_position(self) -> batching.Position:
        """The global data position: the epoch, and how many batches of its global order all ranks
        together have trained (:func:`tfbuilder.data.batching.advance`)."""
        steps = self.batches_seen - self.batches_at_start
        count = self.batches_in_epoch()
        return batching.advance(self.data_start, steps, count=count, world=self.trainer.world_size)

    def _sum_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.trainer.strategy.reduce(tensor, reduce_op="sum")

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
        if self._head_sums is not None and self.head is not None and result.outputs is not None:
            self._head_sums += head_metrics.batch_sums(
                self.head.type, result.outputs, batch["labels"], self.head.outputs
            )

    def on_validation_epoch_end(self) -> None:
        nll, correct, tokens = self.trainer.strategy.reduce(self._val, reduce_op="sum").tolist()
        loss = nll / max(tokens, 1)
        self.log("val_loss", loss, prog_bar=True, sync_dist=False, rank_zero_only=False)
        if self._head_sums is not None and self.head is not None:  # accuracy and macro-F1, or MSE and Pearson's r
            sums = self.trainer.strategy.reduce(self._head_sums, reduce_op="sum")
            for name, value in head_metrics.scores(self.head.type, sums, self.head.outputs, prefix="val_").items():
                self.log(name, value, sync_dist=False)
            return
        self.log("val_ppl", math.exp(min(loss, 50)), sync_dist=False)
        self.log("val_acc", correct / max(tokens, 1), sync_dist=False)
        if self.bleu_lines is not None and self.vocab is not None:
            self.log("val_bleu", self.validation_bleu(self.vocab, *self.bleu_lines), sync_dist=False)

    def validation_bleu(self, vocab: Vocab, sources: list[str], references: list[str]) -> float:
        """sacreBLEU of greedy translations of ``sources`` (every rank computes the same score)."""
        import sacrebleu

        hypotheses = list(translate(self.model, vocab, sources, beam=1))
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

    # --- sharding -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        # Called by Lightning under every strategy, before the optimizer is made (and again at a later
        # stage: what is applied once is not applied again).
        if self.recipe.trainer.activation_checkpointing:
            sharding.checkpoint_activations(self.model)
        mesh = self.device_mesh if self.recipe.trainer.strategy == "fsdp" else None
        if mesh is not None and not sharding.is_sharded(self.model):
            sharding.shard(self.model, mesh["data_parallel"], self.recipe.trainer.precision)

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
            numbering.KEY: self.metrics_steps,
            "world_size": self.trainer.world_size,
            "data_position": self._saved_position(),  # global: a resume may run on another number of ranks
        }

    def _saved_position(self) -> dict:
        epoch, batch = self.data_position()
        return {"epoch": epoch, "batch": batch, "seed": self.recipe.trainer.seed, "batches": self.batches_in_epoch()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        saved = checkpoint["tfbuilder"]
        self.batches_seen = int(saved["batches_seen"])
        position = saved.get("data_position")
        if position is not None:
            self.data_start = (int(position["epoch"]), int(position["batch"]))
            self.batches_at_start = self.batches_seen
        else:  # an older checkpoint: batches_seen is this rank's count, on as many ranks (fit refuses another)
            self.data_start, self.batches_at_start = (0, 0), 0
        self.train_tokens = int(saved.get("train_tokens", 0))
        self.train_seconds = float(saved.get("train_seconds", 0.0))
        self.elapsed_before = float(saved.get("elapsed", 0.0))
        self.history = list(saved.get("history") or [])
        self.metrics_steps = numbering.of(saved)

    def on_train_end(self) -> None:
        if self.trainer.world_size > 1:
            # Every rank must end with the same weights; check it rather than assume it.
            # Under FSDP each parameter's full tensor, gathered from its shards, not this rank's shard.
            digest = sharding.digest(self.model).to(self.device)
            gathered = self.trainer.strategy.all_gather(digest)
            self.ranks_agree = bool(torch.all(gathered == gathered[0]))
            # Throughput of the whole job: every rank's target tokens and tokens/s, summed.
            mine = [float(self.train_tokens), self.train_tokens / max(self.train_seconds, 1e-9)]
            summed = self.trainer.strategy.reduce(
                torch.tensor(mine, dtype=torch.float64, device=self.device), reduce_op="sum"
            ).tolist()
            self.all_ranks = (int(summed[0]), summed[1])
