"""Turn a recipe's data section into tokenized splits, checking everything before training starts."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..sections import DataSection
from . import synthetic, text
from . import tokenizers as toks
from .tokenizers import DataError, Tokenizer

log = logging.getLogger("tfbuilder")


@dataclass
class Vocab:
    """The tokenizers of a run: one shared (the paper) or one per side."""

    src: Tokenizer
    tgt: Tokenizer

    @property
    def shared(self) -> bool:
        return self.src is self.tgt

    def to_json(self) -> str:
        if self.shared:
            return json.dumps({"shared": self.tgt.to_json()})
        return json.dumps({"src": self.src.to_json(), "tgt": self.tgt.to_json()})

    @classmethod
    def from_json(cls, text: str) -> "Vocab":
        """The vocabulary :meth:`to_json` wrote; a :class:`DataError` for anything else (empty, damaged)."""
        try:
            data = json.loads(text)
            if isinstance(data, dict) and "shared" in data:
                tok = toks.from_json(data["shared"])
                return cls(tok, tok)
            if not isinstance(data, dict) or not {"src", "tgt"} <= data.keys():
                raise DataError("expected 'shared', or 'src' and 'tgt'")
            return cls(toks.from_json(data["src"]), toks.from_json(data["tgt"]))
        except DataError as exc:
            raise DataError(f"not a tfbuilder vocabulary: {exc}") from None
        except Exception as exc:  # noqa: BLE001 (json, and HF tokenizers raise plain Exceptions)
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise DataError(f"not a tfbuilder vocabulary: {first}") from None


@dataclass
class Split:
    """Tokenized examples of one split (targets are None for monolingual text)."""

    src: list[list[int]]
    tgt: list[list[int]] | None = None
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class Prepared:
    vocab: Vocab
    splits: dict[str, Split] = field(default_factory=dict)
    raw: dict[str, tuple[list[str], list[str] | None]] = field(default_factory=dict)  # for BLEU


def raw_splits(data: DataSection) -> dict[str, tuple[list[str], list[str] | None]]:
    """The text of every split, read and checked (files, alignment, emptiness)."""
    names = {"train": data.splits.train, "val": data.splits.val, "test": data.splits.test}
    if data.type == "synthetic":
        sizes = {"train": data.train_size, "val": data.val_size, "test": data.test_size}
        return {
            split: synthetic.generate(data.task, n=sizes[split], symbols=data.symbols, lengths=data.lengths, seed=data.seed + i)
            for i, split in enumerate(("train", "val", "test"))
        }
    directory = Path(data.path)
    out: dict[str, tuple[list[str], list[str] | None]] = {}
    for split, stem in names.items():
        langs = (data.src_lang, data.tgt_lang) if data.type == "parallel" else (data.lang,)
        if split == "test" and not any(text.exists(directory, stem, lang) for lang in langs):
            continue  # a test split is optional for training
        if data.type == "parallel":
            out[split] = text.read_parallel(directory, stem, data.src_lang, data.tgt_lang)
        else:
            out[split] = (text.read_lines(text.find(directory, stem, data.lang)), None)
    return out


def build_vocab(data: DataSection, train: tuple[list[str], list[str] | None]) -> Vocab:
    """Train the tokenizer(s) on the training split."""
    if data.type == "synthetic":
        tok = toks.CharTokenizer(synthetic.alphabet(data.symbols))
        return Vocab(tok, tok)
    src, tgt = train
    size = data.tokenizer.vocab_size
    if tgt is None or data.tokenizer.shared:
        tok = toks.train(data.tokenizer.type, src + (tgt or []), size)
        return Vocab(tok, tok)
    return Vocab(toks.train(data.tokenizer.type, src, size), toks.train(data.tokenizer.type, tgt, size))


def encode(vocab: Vocab, src: list[str], tgt: list[str] | None, *, max_len: int | None) -> Split:
    """Tokenize a split, dropping empty pairs and (when ``max_len``) pairs longer than it."""
    src_ids = vocab.src.encode_batch(src)
    tgt_ids = vocab.tgt.encode_batch(tgt) if tgt is not None else None
    keep = [
        i
        for i in range(len(src_ids))
        if src_ids[i]
        and (tgt_ids is None or tgt_ids[i])
        and (max_len is None or (len(src_ids[i]) <= max_len and (tgt_ids is None or len(tgt_ids[i]) <= max_len)))
    ]
    return Split(
        [src_ids[i] for i in keep],
        [tgt_ids[i] for i in keep] if tgt_ids is not None else None,
        dropped=len(src_ids) - len(keep),
    )


def prepare(data: DataSection, *, vocab: Vocab | None = None, model_vocab: int | None = None) -> Prepared:
    """Read, check and tokenize all splits; train the vocabulary unless one is given (resume, other ranks)."""
    raw = raw_splits(data)
    vocab = vocab or build_vocab(data, raw["train"])
    if model_vocab is not None and vocab.tgt.vocab_size != model_vocab:
        raise DataError(f"the tokenizer has {vocab.tgt.vocab_size} tokens but the model expects {model_vocab}")
    prepared = Prepared(vocab, raw=raw)
    for split, (src, tgt) in raw.items():
        prepared.splits[split] = encode(vocab, src, tgt, max_len=data.max_len if split == "train" else None)
        if split == "train" and prepared.splits[split].dropped:
            log.info("dropped %d training examples (empty, or longer than data.max_len=%d)", prepared.splits[split].dropped, data.max_len)
        if len(prepared.splits[split]) == 0:
            raise DataError(f"the {split} split has no usable examples")
    budget = data.max_tokens
    if budget is not None:
        longest = max(positions(s) for s in prepared.splits.values())
        if longest > budget:
            raise DataError(f"data.max_tokens ({budget}) is smaller than the longest example ({longest} tokens with its special tokens)")
    return prepared


def positions(split: Split) -> int:
    """The most positions one example of ``split`` takes in a batch, special tokens included (see
    collate.Collate): x</s>, <s>y and y</s> for translation; <s>x</s> for language models."""
    if split.tgt is None:
        return max(map(len, split.src)) + 2
    return max(max(map(len, split.src)), max(map(len, split.tgt))) + 1
