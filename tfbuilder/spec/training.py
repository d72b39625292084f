"""The run's recipe sections: optimisation (``optim``, with its schedule and Muon's settings) and the
training loop (``trainer``) (schema only, no tensors)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tfbuilder.errors import did_you_mean
from tfbuilder.spec.base import MAX_SEED, Issue, Section, StrictFloat, fail, no_nul

LOGGER_NAMES = ("csv", "tensorboard", "wandb", "mlflow")
"""What ``trainer.loggers`` may name (the loggers themselves are :mod:`tfbuilder.train.loggers`)."""


def _logger_name(value: str) -> str:
    if value not in LOGGER_NAMES:
        raise PydanticCustomError("logger_name", "unknown logger{hint}", {"hint": did_you_mean(value, LOGGER_NAMES)})
    return value


LoggerName = Annotated[str, AfterValidator(_logger_name)]


class ScheduleSection(Section):
    """Learning-rate schedule."""

    type: Literal["inverse_sqrt", "cosine", "constant"] = Field(
        "inverse_sqrt",
        description="inverse_sqrt: scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (sec. 5.3); "
        "cosine: linear warm-up to optim.lr then cosine decay to min_lr; constant: warm-up to optim.lr",
    )
    warmup: int = Field(4000, ge=0, le=100_000_000, description="warm-up steps")
    scale: float = Field(1.0, gt=0.0, description="multiplies the inverse_sqrt schedule")
    min_lr: float = Field(0.0, ge=0.0, description="cosine: learning rate at the last step")


class MuonSection(Section):
    """Muon's settings (Jordan et al. 2024; torch.optim.Muon), for optim.optimizer: muon."""

    lr: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="Muon's peak learning rate (the reference: 0.02 with adjust_lr original); "
        "its schedule is optim.schedule's times lr / optim.lr; default optim.lr",
    )
    momentum: float = Field(0.95, ge=0.0, lt=1.0, description="momentum of the update before orthogonalisation")
    nesterov: bool = Field(True, description="Nesterov momentum")
    ns_steps: int = Field(5, ge=1, le=20, description="Newton-Schulz iterations that orthogonalise each update")
    weight_decay: float | None = Field(
        None, ge=0.0, le=1.0, description="decoupled weight decay of the Muon matrices; default optim.weight_decay"
    )
    adjust_lr: Literal["original", "match_rms_adamw"] = Field(
        "original",
        description="per-matrix rate: original (Keller Jordan's, lr * sqrt(max(1, "
        "rows / cols))) or match_rms_adamw (Moonshot's 0.2 * lr * sqrt(max(rows, cols)), "
        "so AdamW's lr and decay carry over)",
    )


class OptimSection(Section):
    """Optimisation: the paper's Adam and warm-up by default (sec. 5.3), label smoothing (sec. 5.4)."""

    optimizer: Literal["adam", "adamw", "muon"] = Field(
        "adam",
        description="adam, adamw, or muon: Muon for the 2-D weights of the stacks, AdamW (lr, betas, eps, "
        "weight_decay) for embeddings, the head, norms, biases and scalars",
    )
    muon: MuonSection = Field(default_factory=MuonSection, description="Muon's settings (optimizer: muon)")
    lr: float = Field(1e-3, gt=0.0, description="peak learning rate (cosine, constant); inverse_sqrt uses scale")
    betas: tuple[StrictFloat, StrictFloat] = Field((0.9, 0.98), strict=False, description="Adam beta1, beta2")
    eps: float = Field(1e-9, gt=0.0, description="Adam epsilon")
    weight_decay: float = Field(
        0.0,
        ge=0.0,
        description="decoupled weight decay (adamw) of weight matrices and embedding tables; biases, "
        "norm gains and learned scalars are not decayed",
    )
    schedule: ScheduleSection = Field(default_factory=ScheduleSection, description="learning-rate schedule")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="epsilon_ls of the smoothed cross-entropy")
    z_loss: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="weight w of the auxiliary z-loss w * log(Z)^2 per target token, Z the softmax normaliser (PaLM, "
        "Chowdhery et al. 2022: 1e-4); 0: off",
    )
    grad_clip: float | None = Field(None, gt=0.0, description="clip the gradient norm to this value")
    accumulate: int = Field(
        1,
        ge=1,
        le=65_536,
        description="batches per optimizer step; the step averages the loss over all their target tokens, "
        "like one batch this many times larger",
    )

    @model_validator(mode="after")
    def _check(self) -> OptimSection:
        problems: list[Issue] = [
            (("betas", i), f"Adam beta{i + 1} must be in [0, 1), got {b}", b)
            for i, b in enumerate(self.betas)
            if not 0 <= b < 1
        ]
        if self.optimizer != "muon" and self.muon != MuonSection():
            problems.append(
                (("muon",), f"muon settings apply to optimizer: muon (this recipe's is {self.optimizer})", None)
            )
        fail("OptimSection", problems)
        return self


class TrainerSection(Section):
    """What Lightning's Trainer is told, and where runs go."""

    max_steps: int = Field(
        100_000, ge=1, le=1_000_000_000, description="optimizer steps to train (the paper: 100k base, 300k big)"
    )
    max_epochs: int | None = Field(
        None, ge=1, le=1_000_000, description="stop after this many passes over the data, if sooner"
    )
    max_minutes: float | None = Field(
        None, gt=0, le=525_600, description="stop after this much wall time, if sooner (at most a year)"
    )
    val_every: int = Field(1000, ge=1, description="validate (and checkpoint) every this many steps")
    val_batches: int | None = Field(None, ge=1, description="validate on at most this many batches")
    val_bleu: int = Field(
        0,
        ge=0,
        description="at each validation, translate the first N validation sentences (greedy) and log their sacreBLEU "
        "as val_bleu; 0: off",
    )
    monitor: Literal["val_loss", "val_bleu", "val_acc", "val_f1", "val_mse"] = Field(
        "val_loss",
        description="what makes a checkpoint best.ckpt and drives patience: "
        "val_loss (lower is better), val_bleu (higher; needs val_bleu), "
        "val_acc (higher), and for a sequence head val_f1 (higher; classify) or val_mse (lower; regress)",
    )
    patience: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="stop after this many validations without improvement of monitor; unset: never",
    )
    keep_last: int = Field(
        0,
        ge=0,
        le=1000,
        description="also keep the N most recent validated checkpoints as checkpoints/step-<n>.ckpt (for tfbuilder "
        "average)",
    )
    log_every: int = Field(
        50, ge=1, description="log training metrics (and check the loss is finite) every this many steps"
    )
    precision: Literal["32", "64", "bf16-mixed", "16-mixed"] = Field("32", description="numeric precision")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = Field(
        "auto", description="device kind (auto: a GPU when present)"
    )
    devices: (
        Annotated[int, Field(ge=1, le=4096)]
        | Annotated[list[Annotated[int, Field(ge=0, le=4095)]], Field(min_length=1, max_length=4096)]
        | Literal["auto"]
    ) = Field(
        "auto",
        description="devices (or CPU processes) per node: a count, 'auto', or the indices of the GPUs to use ([1] is "
        "the second GPU)",
    )
    strategy: Literal["auto", "ddp", "fsdp"] = Field(
        "auto",
        description="distribution strategy: ddp (a replica per process) or fsdp (FSDP2: each layer's weights, "
        "gradients and optimizer state sharded over the processes; checkpoints are folders of shards)",
    )
    num_nodes: int = Field(1, ge=1, le=100_000, description="machines (launched by SLURM or torchrun)")
    activation_checkpointing: bool = Field(
        False,
        description="recompute each encoder/decoder layer's activations in the backward instead of keeping them "
        "(less memory, about one more forward of compute); any strategy",
    )
    deterministic: bool = Field(False, description="deterministic algorithms (bit-equal resume on the CPU)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of initialisation, dropout and data order")
    compile: bool = Field(
        False,
        description="torch.compile the model's features and loss as one graph (for GPUs: "
        "on CPUs compiling costs more than it saves)",
    )
    output: str = Field("runs", min_length=1, description="runs go to <output>/<name>/version_<n>/")
    _output_path = field_validator("output")(no_nul)
    logger: Literal["csv", "tensorboard"] = Field(
        "csv", description="an older spelling: tensorboard is loggers: [tensorboard]"
    )
    loggers: list[LoggerName] = Field(
        default_factory=list,
        max_length=len(LOGGER_NAMES),
        description="where metrics go besides metrics.csv (always written): any of tensorboard, wandb, mlflow "
        "(Lightning's loggers; wandb and mlflow are the extras of the same names), each given the resolved recipe",
    )
    progress: bool = Field(
        True,
        description="show the step, loss, tokens/s, learning rate and ETA while training (false: "
        "only the start and each validation)",
    )
    threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto",
        description="CPU threads of the training process; "
        "auto: the cores not already busy (cores minus those other processes keep busy, at least 1), "
        "since threads fighting another process for a core run many times slower",
    )

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_number(cls, value: Any) -> Any:
        # `precision: 32` is what people write (and what Lightning accepts).
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check(self) -> TrainerSection:
        twice = sorted({name for name in self.loggers if self.loggers.count(name) > 1})
        if twice:
            fail("TrainerSection", [(("loggers",), f"loggers names {', '.join(twice)} twice", self.loggers)])
        if isinstance(self.devices, list) and len(set(self.devices)) != len(self.devices):
            fail("TrainerSection", [(("devices",), f"devices {self.devices} names a device twice", self.devices)])
        if self.monitor == "val_bleu" and not self.val_bleu:
            fail(
                "TrainerSection",
                [
                    (
                        ("monitor",),
                        "monitor: val_bleu needs trainer.val_bleu: N (sentences translated at each validation)",
                        self.monitor,
                    )
                ],
            )
        return self


__all__ = ["LOGGER_NAMES", "MuonSection", "OptimSection", "ScheduleSection", "TrainerSection"]
