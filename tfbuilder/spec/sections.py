"""Recipe sections other than the model: data, optimisation, trainer (schema only, no tensors)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from tfbuilder.errors import did_you_mean
from tfbuilder.spec import formats
from tfbuilder.spec.formats import FormatName
from tfbuilder.spec.ports import tokenizer_files
from tfbuilder.specials import COUNT as SPECIAL_COUNT
from tfbuilder.specials import SPECIAL_TOKENS  # noqa: F401 (re-exported for the data layer)

MLM_PROBABILITY = 0.15  # BERT's share of tokens a masked LM predicts (Devlin et al. 2019, sec. 3.1)
DEFAULT_BATCH_SIZE = 32  # sentences per batch when a recipe sets neither max_tokens nor batch_size
SYNTHETIC_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
# Bounds on what a recipe may ask for: far beyond any real run, short of what hangs or cannot work.
MAX_SEED = 2**32 - 1  # numpy and the data order take 32-bit seeds
MAX_EXAMPLES = 10_000_000  # synthetic examples per split (generated in memory, in Python)
MAX_SYNTHETIC_LEN = 100_000
MAX_SYNTHETIC_TOKENS = 1_000_000_000  # examples x longest length

LOGGER_NAMES = ("csv", "tensorboard", "wandb", "mlflow")
"""What ``trainer.loggers`` may name (the loggers themselves are :mod:`tfbuilder.train.loggers`)."""


class Section(BaseModel):
    """A recipe section: unknown keys are errors, no silent coercion (``yes`` is not 1.0), no inf/nan."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def fail(model: str, problems: list[tuple[tuple, str, Any]]) -> None:
    """Raise cross-field ``problems`` (loc, message, value) as one ValidationError, each at its loc."""
    if problems:
        details = [
            InitErrorDetails(type=PydanticCustomError("cross_field", message), loc=loc, input=value)
            for loc, message, value in problems
        ]
        raise ValidationError.from_exception_data(model, details)


def _logger_name(value: str) -> str:
    if value not in LOGGER_NAMES:
        raise PydanticCustomError("logger_name", "unknown logger{hint}", {"hint": did_you_mean(value, LOGGER_NAMES)})
    return value


LoggerName = Annotated[str, AfterValidator(_logger_name)]
StrictFloat = Annotated[float, Strict()]
StrictInt = Annotated[int, Strict()]


def no_nul(value: str | None) -> str | None:
    """A path the operating system can open: no NUL byte (a path cannot hold one)."""
    if value is not None and "\x00" in value:
        raise PydanticCustomError("path_nul", "a path cannot hold a NUL byte")
    return value


class SpecialNames(Section):
    """The special tokens of a given tokenizer, by name, where they are not the usual ones."""

    pad: str | None = Field(
        None, min_length=1, max_length=200, description="the padding token (found by default: <pad>, [PAD])"
    )
    bos: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the start token (found by default: <s>, [CLS], <|startoftext|>, ...)",
    )
    eos: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the end token (found by default: </s>, [SEP], <|endoftext|>, ...)",
    )
    unk: str | None = Field(
        None, min_length=1, max_length=200, description="the unknown token (found by default: <unk>, [UNK])"
    )
    mask: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the mask token of a masked LM (found by default: <mask>, [MASK])",
    )


class TokenizerSection(Section):
    """How text becomes ids. Tokenizers trained here (bpe, char, sentencepiece) have <pad>, <s>, </s>,
    <unk>, <mask> at ids 0-4; a given one (pretrained, or sentencepiece with a path) keeps its own."""

    type: Literal["bpe", "char", "sentencepiece", "pretrained"] = Field(
        "bpe",
        description="bpe (byte-level BPE, HF tokenizers) or char, trained on the data; sentencepiece: a SentencePiece "
        "model, trained on the data or given as path; pretrained: a Hugging Face tokenizer.json given as path",
    )
    path: str | None = Field(
        None,
        min_length=1,
        description="pretrained: a tokenizer.json (HF tokenizers); sentencepiece: a .model file to use instead of "
        "training one (relative to the working directory)",
    )
    _tokenizer_path = field_validator("path")(no_nul)
    specials: SpecialNames | None = Field(
        None, description="a given tokenizer's special tokens, where they are not the usual names"
    )
    vocab_size: int | None = Field(
        None,
        ge=SPECIAL_COUNT + 1,
        le=10_000_000,
        description="vocabulary size, specials included (a given tokenizer's own when left out)",
    )
    shared: bool = Field(True, description="one vocabulary for source and target (the paper, sec. 5.1)")
    sample: int | None = Field(
        1_000_000,
        ge=1,
        le=1_000_000_000,
        description="train the tokenizer on this many training examples, drawn uniformly (every example when the "
        "split is smaller); null: on all of them",
    )

    @model_validator(mode="after")
    def _check(self) -> TokenizerSection:
        problems: list[tuple[tuple, str, Any]] = []
        if self.type == "pretrained" and self.path is None:
            problems.append((("path",), "a pretrained tokenizer needs path: its tokenizer.json", None))
        if self.path is not None and self.type not in ("pretrained", "sentencepiece"):
            problems.append(
                (
                    ("path",),
                    f"a {self.type} tokenizer is trained on the data; path is for pretrained or sentencepiece",
                    self.path,
                )
            )
        if self.path is not None and not self.shared:
            problems.append(
                (("shared",), "a tokenizer file is one vocabulary for both sides: shared must be true", False)
            )
        if self.specials is not None and self.path is None:
            problems.append(
                (
                    ("specials",),
                    "specials name the tokens of a given tokenizer (set path); a trained one has its own at ids 0-4",
                    None,
                )
            )
        fail("TokenizerSection", problems)
        return self

    @property
    def given(self) -> bool:
        """Whether the tokenizer is a file (pretrained, or a SentencePiece model), not trained on the data."""
        return self.path is not None

    def facts(self):
        """The vocabulary size and special ids of the tokenizer file (:class:`tfbuilder.spec.ports.Facts`),
        or None (trained on the data, or the file cannot be read: preparing the data says why)."""
        if self.path is None:
            return None
        # reads the file (through the data layer): only when a recipe names one
        return tokenizer_files().facts(self.type, self.path, self.specials.model_dump() if self.specials else None)


# What _plain_stem checks, for editors (ECMA regex: the schema may say what pydantic's regex cannot).
STEM_SCHEMA = {"pattern": "^(?!\\.*$)[^/\\\\*?\\[\\]\\u0000]+$"}


class SplitsSection(Section):
    """The splits: file stems (``<path>/<stem>.<lang>`` or ``<stem>.<lang>.gz``), or the split names of a
    Hugging Face dataset (``data.format: datasets``, such as ``validation``)."""

    train: str = Field(
        "train", min_length=1, max_length=255, json_schema_extra=STEM_SCHEMA, description="training split"
    )
    val: str = Field("val", min_length=1, max_length=255, json_schema_extra=STEM_SCHEMA, description="validation split")
    test: str = Field("test", min_length=1, max_length=255, json_schema_extra=STEM_SCHEMA, description="test split")

    @field_validator("train", "val", "test")
    @classmethod
    def _plain_stem(cls, value: str) -> str:
        # A stem names files in data.path: no directories, no glob patterns, no escaping the directory.
        if set(value) & set("/\\*?[]\x00") or value.strip(".") == "":
            raise PydanticCustomError(
                "file_stem", "a split is a file stem such as 'train': no '/', '*', '?', '[', ']', and not '.' or '..'"
            )
        return value


class ColumnsSection(Section):
    """Which fields of a record hold the text (every ``data.format`` but text)."""

    source: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="translation: the source field (JSON, Parquet, datasets: a dotted path into nested records such as translation.de)",
    )
    target: str | None = Field(None, min_length=1, max_length=255, description="translation: the target field")
    text: str | None = Field(
        None, min_length=1, max_length=255, description="language models and labelled data: the text field"
    )
    text_pair: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="labelled data: a second text read with the first (<s> text </s> pair </s>); optional",
    )
    label: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="labelled data: the label field (a class name or integer; a number to regress)",
    )


# A Hub repository id: a name, or owner/name (letters, digits, '-', '_', '.').
HUB_NAME = r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$"


class HubSection(Section):
    """A dataset on the Hugging Face Hub, loaded with ``datasets.load_dataset`` (``data.format: datasets``)."""

    name: str = Field(
        min_length=1, max_length=200, pattern=HUB_NAME, description="the dataset's id on the Hub, such as wmt/wmt14"
    )
    config: str | None = Field(
        None, min_length=1, max_length=200, description="its configuration (subset), such as de-en"
    )
    revision: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="a branch, tag or commit of the dataset's repository (default: its main branch); a commit pins the data",
    )


class DataSection(Section):
    """Where examples come from and how they are batched."""

    type: Literal["synthetic", "parallel", "monolingual", "labelled"] = Field(
        "synthetic",
        description="synthetic tasks, parallel text (translation), monolingual text (language models) or labelled text "
        "(a sequence head: classification, regression; records with columns text, label and optionally text_pair)",
    )
    # synthetic tasks
    task: Literal["copy", "reverse", "sort"] | None = Field(None, description="the synthetic task")
    symbols: int = Field(10, ge=2, le=len(SYNTHETIC_ALPHABET), description="alphabet size of synthetic sequences")
    lengths: tuple[StrictInt, StrictInt] = Field((1, 16), strict=False, description="min and max synthetic length")
    train_size: int = Field(10_000, ge=1, le=MAX_EXAMPLES, description="synthetic training examples")
    val_size: int = Field(500, ge=1, le=MAX_EXAMPLES, description="synthetic validation examples")
    test_size: int = Field(500, ge=1, le=MAX_EXAMPLES, description="synthetic test examples")
    seed: int = Field(1234, ge=0, le=MAX_SEED, description="seed of the synthetic data (independent of trainer.seed)")
    # text
    path: str | None = Field(
        None,
        description="directory of the data files, or (format datasets) the folder DatasetDict.save_to_disk wrote; "
        "relative to the working directory",
    )
    _data_path = field_validator("path")(no_nul)
    src_lang: str | None = Field(None, description="source language suffix: train.<src_lang>[.gz]")
    tgt_lang: str | None = Field(None, description="target language suffix (parallel)")
    lang: str | None = Field(None, description="language suffix of monolingual text")
    splits: SplitsSection = Field(
        default_factory=SplitsSection, description="file stems of the splits (format datasets: split names)"
    )
    format: FormatName = Field(
        "text",
        description="a registered format (plugins may add more): text: <stem>.<lang>[.gz], one example per line; "
        "jsonl, csv, tsv: <stem>.<format>[.gz], records whose fields data.columns names; parquet: <stem>.parquet or its "
        "shards <stem>-*.parquet; datasets: a Hugging Face dataset (a save_to_disk folder in path, or data.hub), its "
        "splits named by data.splits",
    )
    columns: ColumnsSection | None = Field(None, description="every format but text: the fields that hold the text")
    hub: HubSection | None = Field(
        None,
        description="format datasets: a dataset on the Hugging Face Hub (instead of path), downloaded and cached by datasets",
    )
    max_len: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="training examples longer than this (in tokens) are dropped (not with packing)",
    )
    documents: Literal["lines", "paragraphs"] = Field(
        "lines", description="monolingual text: one document per line, or documents separated by blank lines"
    )
    packing: bool = Field(
        False,
        description="language models: join the documents with </s> between them and cut blocks of block_size "
        "tokens, so that no text is dropped (nanoGPT, Megatron)",
    )
    block_size: int | None = Field(None, ge=2, le=1_000_000, description="with packing: tokens per example")
    document_mask: bool = Field(
        False, description="with packing: a token attends only to tokens of its own document (a block-diagonal mask)"
    )
    cache: str | None = Field(
        None,
        min_length=1,
        description="folder of prepared data stores (default: .tfbuilder/ beside the data, or the user cache "
        "folder where the data folder is read-only); TFBUILDER_CACHE overrides the default",
    )
    mlm_probability: float = Field(MLM_PROBABILITY, gt=0.0, lt=1.0, description="masked-LM: share of tokens to predict")
    # tokenizer and batching
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection, description="the tokenizer")
    max_tokens: int | None = Field(
        None, ge=1, le=100_000_000, description="token budget per batch, padding included, for source and target each"
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description=f"sentences per batch (when max_tokens is not set); default {DEFAULT_BATCH_SIZE} when neither is set",
    )
    workers: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        "auto",
        description="processes that build batches beside training; auto: none when training on the CPU (the step "
        "uses every core), else up to 4",
    )

    @model_validator(mode="after")
    def _check(self) -> DataSection:
        problems: list[tuple[tuple, str, Any]] = []
        if self.type == "synthetic":
            if self.task is None:
                problems.append((("task",), "synthetic data needs a task (copy, reverse or sort)", None))
            if not 1 <= self.lengths[0] <= self.lengths[1]:
                problems.append((("lengths",), f"lengths must satisfy 1 <= min <= max, got {list(self.lengths)}", None))
            elif self.lengths[1] > MAX_SYNTHETIC_LEN:
                problems.append(
                    (
                        ("lengths",),
                        f"synthetic lengths are at most {MAX_SYNTHETIC_LEN:,}, got {self.lengths[1]:,}",
                        None,
                    )
                )
            else:
                biggest = max(self.train_size, self.val_size, self.test_size) * self.lengths[1]
                if biggest > MAX_SYNTHETIC_TOKENS:
                    problems.append(
                        (
                            ("train_size",),
                            f"a split of up to {biggest:,} synthetic tokens is more than the {MAX_SYNTHETIC_TOKENS:,} generated in memory",
                            None,
                        )
                    )
            if self.tokenizer.type != "char":
                problems.append((("tokenizer", "type"), "synthetic data uses the char tokenizer", self.tokenizer.type))
        else:
            traits = formats.get(self.format)
            records = formats.choices(columns=True)  # "jsonl, csv, tsv, parquet or datasets"
            if traits.hub:
                if self.path is None and self.hub is None:
                    problems.append(
                        (
                            ("path",),
                            f"{self.type} data in format {self.format} needs a path (a save_to_disk folder) or hub",
                            None,
                        )
                    )
                elif self.path is not None and self.hub is not None:
                    problems.append(
                        (
                            ("hub",),
                            "set path (a save_to_disk folder) or hub (a dataset on the Hub), not both; path: null drops an inherited one",
                            self.hub.name,
                        )
                    )
            elif self.path is None:
                problems.append((("path",), f"{self.type} data needs a path", None))
            if not traits.columns and self.type == "labelled":
                problems.append(
                    (
                        ("format",),
                        f"labelled data is read from records: set format to {records}, and columns.text and columns.label",
                        self.format,
                    )
                )
            elif not traits.columns:
                needed = ("src_lang", "tgt_lang") if self.type == "parallel" else ("lang",)
                for lang in needed if traits.languages else ():
                    if getattr(self, lang) is None:
                        problems.append(((lang,), f"{self.type} data needs {lang}", None))
                if self.columns is not None:
                    problems.append((("columns",), f"columns name fields of records: set format to {records}", None))
                if self.documents != "lines" and not traits.languages:
                    problems.append(
                        (
                            ("documents",),
                            "documents separated by blank lines are plain text (format: text)",
                            self.documents,
                        )
                    )
            else:
                fields = {"parallel": ("source", "target"), "labelled": ("text", "label")}.get(self.type, ("text",))
                optional = ("text_pair",) if self.type == "labelled" else ()
                columns = self.columns or ColumnsSection()
                named = {
                    "source": columns.source,
                    "target": columns.target,
                    "text": columns.text,
                    "text_pair": columns.text_pair,
                    "label": columns.label,
                }
                for name in fields:
                    if named[name] is None:
                        problems.append(
                            (("columns", name), f"{self.type} data in format {self.format} needs columns.{name}", None)
                        )
                for name, value in named.items():
                    if value is not None and name not in fields + optional:
                        problems.append((("columns", name), f"{self.type} data has no {name} column", value))
                if self.documents != "lines":
                    problems.append(
                        (
                            ("documents",),
                            "documents separated by blank lines are plain text (format: text)",
                            self.documents,
                        )
                    )
            if self.tokenizer.vocab_size is None and not self.tokenizer.given:
                problems.append((("tokenizer", "vocab_size"), f"{self.type} data needs tokenizer.vocab_size", None))
            facts = self.tokenizer.facts()
            if facts is None and self.tokenizer.given and self.tokenizer.vocab_size is None:
                # (A resolved recipe, as checkpoints keep it, carries the size: it loads without the file.)
                named = self.tokenizer.specials.model_dump() if self.tokenizer.specials else None
                problems.append(
                    (
                        ("tokenizer", "path"),
                        tokenizer_files().unreadable(self.tokenizer.type, self.tokenizer.path, named),
                        self.tokenizer.path,
                    )
                )
            if facts is not None and self.tokenizer.vocab_size not in (None, facts.vocab_size):
                problems.append(
                    (
                        ("tokenizer", "vocab_size"),
                        f"the tokenizer file has {facts.vocab_size} tokens, not {self.tokenizer.vocab_size}; leave vocab_size out",
                        self.tokenizer.vocab_size,
                    )
                )
        if self.hub is not None and not formats.get(self.format).hub:
            hubs = formats.choices(hub=True)
            problems.append((("hub",), f"hub names a Hugging Face dataset: set format to {hubs}", self.hub.name))
        if self.max_tokens is not None and self.batch_size is not None:
            problems.append((("batch_size",), "set max_tokens or batch_size, not both", self.batch_size))
        if self.packing:
            if self.type != "monolingual":
                problems.append((("packing",), "packing is for monolingual text (language models)", True))
            if self.block_size is None:
                problems.append((("block_size",), "packing needs block_size (tokens per example)", None))
        else:
            if self.block_size is not None:
                problems.append((("block_size",), "block_size needs packing: true", self.block_size))
            if self.document_mask:
                problems.append((("document_mask",), "document_mask needs packing: true", True))
        if self.documents != "lines" and self.type != "monolingual":
            problems.append((("documents",), "documents are monolingual text", self.documents))
        fail("DataSection", problems)
        return self

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary the tokenizer will have, when the recipe alone decides it."""
        if self.type == "synthetic":
            return SPECIAL_COUNT + self.symbols
        facts = self.tokenizer.facts()
        return facts.vocab_size if facts is not None else self.tokenizer.vocab_size

    @property
    def pad_id(self) -> int | None:
        """The id the data pads with: a given tokenizer's pad token (None: it has none, or its file is
        not here to say), else 0 (<pad>)."""
        if self.type != "synthetic" and self.tokenizer.given:
            facts = self.tokenizer.facts()
            return facts.found["pad"] if facts is not None else None
        return SPECIAL_TOKENS.index("<pad>")


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
        description="Muon's peak learning rate (the reference: 0.02 with adjust_lr original); its schedule is optim.schedule's times lr / optim.lr; default optim.lr",
    )
    momentum: float = Field(0.95, ge=0.0, lt=1.0, description="momentum of the update before orthogonalisation")
    nesterov: bool = Field(True, description="Nesterov momentum")
    ns_steps: int = Field(5, ge=1, le=20, description="Newton-Schulz iterations that orthogonalise each update")
    weight_decay: float | None = Field(
        None, ge=0.0, le=1.0, description="decoupled weight decay of the Muon matrices; default optim.weight_decay"
    )
    adjust_lr: Literal["original", "match_rms_adamw"] = Field(
        "original",
        description="per-matrix rate: original (Keller Jordan's, lr * sqrt(max(1, rows / cols))) or match_rms_adamw (Moonshot's 0.2 * lr * sqrt(max(rows, cols)), so AdamW's lr and decay carry over)",
    )


class OptimSection(Section):
    """Optimisation: the paper's Adam and warm-up by default (sec. 5.3), label smoothing (sec. 5.4)."""

    optimizer: Literal["adam", "adamw", "muon"] = Field(
        "adam",
        description="adam, adamw, or muon: Muon for the 2-D weights of the stacks, AdamW (lr, betas, eps, weight_decay) for embeddings, the head, norms, biases and scalars",
    )
    muon: MuonSection = Field(default_factory=MuonSection, description="Muon's settings (optimizer: muon)")
    lr: float = Field(1e-3, gt=0.0, description="peak learning rate (cosine, constant); inverse_sqrt uses scale")
    betas: tuple[StrictFloat, StrictFloat] = Field((0.9, 0.98), strict=False, description="Adam beta1, beta2")
    eps: float = Field(1e-9, gt=0.0, description="Adam epsilon")
    weight_decay: float = Field(
        0.0,
        ge=0.0,
        description="decoupled weight decay (adamw) of weight matrices and embedding tables; biases, norm gains and learned scalars are not decayed",
    )
    schedule: ScheduleSection = Field(default_factory=ScheduleSection, description="learning-rate schedule")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="epsilon_ls of the smoothed cross-entropy")
    z_loss: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="weight w of the auxiliary z-loss w * log(Z)^2 per target token, Z the softmax normaliser (PaLM, Chowdhery et al. 2022: 1e-4); 0: off",
    )
    grad_clip: float | None = Field(None, gt=0.0, description="clip the gradient norm to this value")
    accumulate: int = Field(
        1,
        ge=1,
        le=65_536,
        description="batches per optimizer step; the step averages the loss over all their target tokens, like one batch this many times larger",
    )

    @model_validator(mode="after")
    def _check(self) -> OptimSection:
        problems = [
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
        description="at each validation, translate the first N validation sentences (greedy) and log their sacreBLEU as val_bleu; 0: off",
    )
    monitor: Literal["val_loss", "val_bleu", "val_acc", "val_f1", "val_mse"] = Field(
        "val_loss",
        description="what makes a checkpoint best.ckpt and drives patience: val_loss (lower is better), val_bleu (higher; needs val_bleu), "
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
        description="also keep the N most recent validated checkpoints as checkpoints/step-<n>.ckpt (for tfbuilder average)",
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
        description="devices (or CPU processes) per node: a count, 'auto', or the indices of the GPUs to use ([1] is the second GPU)",
    )
    strategy: Literal["auto", "ddp", "fsdp"] = Field("auto", description="distribution strategy")
    num_nodes: int = Field(1, ge=1, le=100_000, description="machines (launched by SLURM or torchrun)")
    deterministic: bool = Field(False, description="deterministic algorithms (bit-equal resume on the CPU)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of initialisation, dropout and data order")
    compile: bool = Field(
        False,
        description="torch.compile the model's features and loss as one graph (for GPUs: on CPUs compiling costs more than it saves)",
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
        description="show the step, loss, tokens/s, learning rate and ETA while training (false: only the start and each validation)",
    )
    threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto",
        description="CPU threads of the training process; auto: the cores not already busy (cores minus those other processes keep busy, at least 1), "
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


__all__ = ["DataSection", "OptimSection", "Section", "TrainerSection", "fail"]
