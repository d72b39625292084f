"""The recipe's ``data`` section: where examples come from, how text becomes ids, how examples are
batched (schema only, no tensors). The run's sections (``optim``, ``trainer``) are
:mod:`tfbuilder.spec.training`, re-exported here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticCustomError

from tfbuilder.spec import formats
from tfbuilder.spec.base import MAX_SEED, Issue, Section, StrictInt, fail, no_nul
from tfbuilder.spec.formats import FormatName
from tfbuilder.spec.ports import Facts, tokenizer_files
from tfbuilder.spec.training import LOGGER_NAMES, MuonSection, OptimSection, ScheduleSection, TrainerSection
from tfbuilder.spec.yaml_source import Written
from tfbuilder.specials import COUNT as SPECIAL_COUNT
from tfbuilder.specials import SPECIAL_TOKENS

MLM_PROBABILITY = 0.15  # BERT's share of tokens a masked LM predicts (Devlin et al. 2019, sec. 3.1)
DEFAULT_BATCH_SIZE = 32  # sentences per batch when a recipe sets neither max_tokens nor batch_size
SYNTHETIC_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
# Bounds on what a recipe may ask for: far beyond any real run, short of what hangs or cannot work.
MAX_EXAMPLES = 1_000_000  # synthetic examples per split (generated in memory, in Python)
MAX_SYNTHETIC_LEN = 100_000
MAX_SYNTHETIC_TOKENS = 20_000_000  # examples x longest length: about 10 s and 500 MB to generate


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
        "model, trained on the data or given as path; pretrained: a Hugging Face tokenizer.json given as path, or "
        "without path the tokenizer of the weights `fit --init-from` starts from (an imported model's)",
    )
    path: str | None = Field(
        None,
        min_length=1,
        description="pretrained: a tokenizer.json (HF tokenizers); sentencepiece: a .model file to use instead of "
        "training one (in a recipe file relative to that file's folder, in --set relative to the working directory)",
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
        problems: list[Issue] = []
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

    def facts(self) -> Facts | None:
        """The vocabulary size and special ids of the tokenizer file (:class:`tfbuilder.spec.ports.Facts`),
        or None (trained on the data, or the file cannot be read: preparing the data says why)."""
        if self.path is None:
            return None
        # reads the file (through the data layer): only when a recipe names one
        return tokenizer_files().facts(self.type, self.path, self.specials.model_dump() if self.specials else None)


# What _plain_stem checks, for editors (ECMA regex: the schema may say what pydantic's regex cannot).
STEM_SCHEMA: JsonDict = {"pattern": "^(?!\\.*$)[^/\\\\*?\\[\\]\\u0000]+$"}


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
        description="translation: the source field (JSON, Parquet, datasets: "
        "a dotted path into nested records such as translation.de)",
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
        description="a branch, tag or commit of the dataset's repository (default: its main branch); "
        "a commit pins the data",
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
        "in a recipe file relative to that file's folder (as extends is), in --set relative to the working directory",
    )
    _data_path = field_validator("path")(no_nul)
    _written: Written | None = PrivateAttr(None)
    src_lang: str | None = Field(None, description="source language suffix: train.<src_lang>[.gz]")
    tgt_lang: str | None = Field(None, description="target language suffix (parallel)")
    lang: str | None = Field(None, description="language suffix of monolingual text")
    splits: SplitsSection = Field(
        default_factory=SplitsSection, description="file stems of the splits (format datasets: split names)"
    )
    format: FormatName = Field(
        "text",
        description="a registered format (plugins may add more): text: <stem>.<lang>[.gz], one example per line; "
        "jsonl, csv, tsv: <stem>.<format>[.gz], records whose fields data.columns names; "
        "parquet: <stem>.parquet or its shards <stem>-*.parquet; "
        "datasets: a Hugging Face dataset (a save_to_disk folder in path, or data.hub), "
        "its splits named by data.splits",
    )
    columns: ColumnsSection | None = Field(None, description="every format but text: the fields that hold the text")
    hub: HubSection | None = Field(
        None,
        description="format datasets: a dataset on the Hugging Face Hub (instead of path), "
        "downloaded and cached by datasets",
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
        description=f"sentences per batch (when max_tokens is not set); "
        f"default {DEFAULT_BATCH_SIZE} when neither is set",
    )
    workers: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        "auto",
        description="processes that build batches beside training; auto: none when training on the CPU (the step "
        "uses every core), else up to 4",
    )

    @model_validator(mode="after")
    def _check(self) -> DataSection:
        if self.type == "synthetic":
            problems = self._synthetic_problems()
        else:
            problems = self._location_problems() + self._format_problems() + self._tokenizer_problems()
        problems += self._batching_problems()
        fail("DataSection", problems)
        return self

    def _synthetic_problems(self) -> list[Issue]:
        """A synthetic task, lengths that make sense and fit in memory, and the char tokenizer."""
        problems: list[Issue] = []
        if self.task is None:
            problems.append((("task",), "synthetic data needs a task (copy, reverse or sort)", None))
        if not 1 <= self.lengths[0] <= self.lengths[1]:
            problems.append((("lengths",), f"lengths must satisfy 1 <= min <= max, got {list(self.lengths)}", None))
        elif self.lengths[1] > MAX_SYNTHETIC_LEN:
            message = f"synthetic lengths are at most {MAX_SYNTHETIC_LEN:,}, got {self.lengths[1]:,}"
            problems.append((("lengths",), message, None))
        else:
            biggest = max(self.train_size, self.val_size, self.test_size) * self.lengths[1]
            if biggest > MAX_SYNTHETIC_TOKENS:
                message = (
                    f"a split of up to {biggest:,} synthetic tokens is more than the "
                    f"{MAX_SYNTHETIC_TOKENS:,} generated in memory"
                )
                problems.append((("train_size",), message, None))
        if self.tokenizer.type != "char":
            problems.append((("tokenizer", "type"), "synthetic data uses the char tokenizer", self.tokenizer.type))
        return problems

    def _location_problems(self) -> list[Issue]:
        """Where the text is: a path, or (format datasets) a path or a Hub dataset."""
        if not formats.get(self.format).hub:
            return [] if self.path is not None else [(("path",), f"{self.type} data needs a path", None)]
        if self.path is None and self.hub is None:
            message = f"{self.type} data in format {self.format} needs a path (a save_to_disk folder) or hub"
            return [(("path",), message, None)]
        if self.path is not None and self.hub is not None:
            message = (
                "set path (a save_to_disk folder) or hub (a dataset on the Hub), not both; "
                "path: null drops an inherited one"
            )
            return [(("hub",), message, self.hub.name)]
        return []

    def _format_problems(self) -> list[Issue]:
        """What the format needs to read this type of data: languages (text) or columns (records)."""
        traits = formats.get(self.format)
        records = formats.choices(columns=True)  # "jsonl, csv, tsv, parquet or datasets"
        if not traits.columns and self.type == "labelled":
            message = f"labelled data is read from records: set format to {records}, and columns.text and columns.label"
            return [(("format",), message, self.format)]
        if not traits.columns:
            needed = ("src_lang", "tgt_lang") if self.type == "parallel" else ("lang",)
            problems: list[Issue] = [
                ((lang,), f"{self.type} data needs {lang}", None)
                for lang in (needed if traits.languages else ())
                if getattr(self, lang) is None
            ]
            if self.columns is not None:
                message = f"columns name fields of records: set format to {records}"
                problems.append((("columns",), message, None))
            if self.documents != "lines" and not traits.languages:
                message = "documents separated by blank lines are plain text (format: text)"
                problems.append((("documents",), message, self.documents))
            return problems
        return self._column_problems()

    def _column_problems(self) -> list[Issue]:
        """Records: the columns this type of data reads, and no others; one document per record."""
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
        problems: list[Issue] = [
            (("columns", name), f"{self.type} data in format {self.format} needs columns.{name}", None)
            for name in fields
            if named[name] is None
        ]
        for name, value in named.items():
            if value is not None and name not in fields + optional:
                problems.append((("columns", name), f"{self.type} data has no {name} column", value))
        if self.documents != "lines":
            message = "documents separated by blank lines are plain text (format: text)"
            problems.append((("documents",), message, self.documents))
        return problems

    def _tokenizer_problems(self) -> list[Issue]:
        """A vocabulary size for a trained tokenizer; a given tokenizer's file readable, its size its own."""
        problems: list[Issue] = []
        if self.tokenizer.vocab_size is None and not self.tokenizer.given:
            problems.append((("tokenizer", "vocab_size"), f"{self.type} data needs tokenizer.vocab_size", None))
        facts = self.tokenizer.facts()
        path = self.tokenizer.path  # given: not None
        if facts is None and path is not None and self.tokenizer.vocab_size is None:
            # (A resolved recipe, as checkpoints keep it, carries the size: it loads without the file.)
            named = self.tokenizer.specials.model_dump() if self.tokenizer.specials else None
            problems.append(
                (("tokenizer", "path"), tokenizer_files().unreadable(self.tokenizer.type, path, named), path)
            )
        if facts is not None and self.tokenizer.vocab_size not in (None, facts.vocab_size):
            message = (
                f"the tokenizer file has {facts.vocab_size} tokens, not {self.tokenizer.vocab_size}; "
                "leave vocab_size out"
            )
            problems.append((("tokenizer", "vocab_size"), message, self.tokenizer.vocab_size))
        return problems

    def _batching_problems(self) -> list[Issue]:
        """Settings that belong to another format, batching mode or type of data."""
        problems: list[Issue] = []
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
        return problems

    @property
    def written_path(self) -> Written | None:
        """``path`` as the recipe file wrote it, where that file made it relative to its folder (``path``
        holds the result); None where it is used as given."""
        return self._written

    def relocate(self, path: str) -> None:
        """Read the data from ``path`` instead (the data layer's fallback, where the file-relative
        folder does not exist but the working-directory one does); the recorded recipe says it."""
        self.path = path
        self._written = None

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


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "LOGGER_NAMES",
    "MLM_PROBABILITY",
    "SPECIAL_COUNT",
    "SPECIAL_TOKENS",
    "SYNTHETIC_ALPHABET",
    "DataSection",
    "MuonSection",
    "OptimSection",
    "ScheduleSection",
    "Section",
    "TokenizerSection",
    "TrainerSection",
    "fail",
]
