"""Tokenizers: byte-level BPE (HF ``tokenizers``) and characters, with the specials at ids 0-4; the
tokenizers people already have (a ``tokenizer.json``, SentencePiece) are in :mod:`.pretrained`.

A tokenizer serialises to a JSON string, so that checkpoints carry it as plain data; ``hf_json()``
gives, where it can be written as one, the Hugging Face ``tokenizers`` file of the same tokenizer.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tfbuilder.specials import SpecialIds

from tfbuilder.data.pretrained import (
    PretrainedTokenizer,
    SentencePieceTokenizer,
    char_hf_json,
    find_specials,
    hf_tokenizer,
    special_ids,
    tokenizer_failures,
)
from tfbuilder.errors import DataError  # noqa: F401 (re-exported: the data layer's error)
from tfbuilder.spec.sections import SPECIAL_TOKENS
from tfbuilder.specials import BOS, EOS, MASK, OWN, PAD, UNK, SpecialIds  # noqa: F401 (re-exported: the ids 0-4)


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def to_json(self) -> str: ...


@runtime_checkable
class HFWritable(Protocol):
    """A tokenizer that can be written as a Hugging Face ``tokenizers`` file."""

    def hf_json(self) -> str: ...


class CharTokenizer:
    """One id per character; characters outside the vocabulary become <unk>."""

    def __init__(self, chars: str):
        self.chars = chars
        self.vocab_size = len(SPECIAL_TOKENS) + len(chars)
        self._ids = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(chars)}

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> CharTokenizer:
        """Keep the ``vocab_size - 5`` most frequent characters (ties broken by first appearance)."""
        counts = Counter(c for t in texts for c in t)
        keep = vocab_size - len(SPECIAL_TOKENS)
        if len(counts) < keep:
            raise DataError(
                f"the training text has {len(counts)} distinct characters; vocab_size {vocab_size} needs {keep}"
            )
        return cls("".join(c for c, _ in counts.most_common(keep)))

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(c, UNK) for c in text]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def unknown(self, text: str) -> list[str]:
        """The distinct characters of ``text`` outside the vocabulary (read as <unk>), in order."""
        return list(dict.fromkeys(c for c in text if c not in self._ids))

    def decode(self, ids: Iterable[int]) -> str:
        n = len(SPECIAL_TOKENS)
        return "".join(self.chars[i - n] for i in ids if i >= n and i - n < len(self.chars))

    def to_json(self) -> str:
        return json.dumps({"type": "char", "chars": self.chars})

    def hf_json(self) -> str:
        return char_hf_json(self.chars)


class BPETokenizer:
    """Byte-level BPE (Sennrich et al. 2016, arXiv:1508.07909; GPT-2's byte-level variant), lossless on any text."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.where = "the tokenizer"  # named when it fails on a text (a checkpoint's names the checkpoint)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        got = tok.get_vocab_size()
        if got < vocab_size:
            raise DataError(
                f"the training text fills only {got} of the {vocab_size} BPE tokens asked for; "
                f"lower data.tokenizer.vocab_size to at most {got} or add text"
            )
        return cls(tok)

    @classmethod
    def from_json(cls, text: str) -> BPETokenizer:
        return cls(hf_tokenizer(text, "the stored tokenizer"))  # a checkpoint's: checked as a given file is

    def encode(self, text: str) -> list[int]:
        with tokenizer_failures(self.where, "cannot encode the text"):
            return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        with tokenizer_failures(self.where, "cannot encode the text"):
            return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([i for i in ids if i >= len(SPECIAL_TOKENS)]).strip()

    def to_json(self) -> str:
        return json.dumps({"type": "bpe", "tokenizer": self._tok.to_str()})

    def hf_json(self) -> str:
        return self._tok.to_str()


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` used as it is (imported models): its own ids and special tokens,
    which decoding skips. tfbuilder's start and end ids (1, 2) are not remapped onto it."""

    def __init__(self, tokenizer, specials: SpecialIds | None = None, where: str = "the tokenizer"):
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.specials = specials  # the imported model's ids (batches are made with them); None: tfbuilder's
        self.where = where  # the file, named when the tokenizer fails on a text

    @classmethod
    def from_str(cls, text: str, specials: SpecialIds | None = None, *, where: str = "the tokenizer") -> HFTokenizer:
        """The tokenizer in the JSON ``text`` (of the file ``where``): its ids and normalizers bounded
        before the tokenizers library reads it (:func:`~tfbuilder.data.pretrained.check_hf_json`)."""
        return cls(hf_tokenizer(text, where), specials, where)

    @classmethod
    def ids(cls, vocab_size: int, specials: SpecialIds | None = None) -> HFTokenizer:
        """Text is ids written out ("15 7 0"): for a model imported without its tokenizer."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token="0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return cls(tok, specials)

    def named_specials(self) -> SpecialIds:
        """The ids of the tokens this tokenizer names <pad>/[PAD], <s>/[CLS], </s>/[SEP], ... (see
        :mod:`tfbuilder.data.pretrained`)."""

        return special_ids(find_specials(self._tok.token_to_id))

    def encode(self, text: str) -> list[int]:
        with tokenizer_failures(self.where, "cannot encode the text"):
            return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        with tokenizer_failures(self.where, "cannot encode the text"):
            return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        with tokenizer_failures(self.where, "cannot decode the ids"):
            return self._tok.decode(list(ids), skip_special_tokens=True).strip()

    def to_json(self) -> str:
        saved = {"type": "hf", "tokenizer": self._tok.to_str()}
        return json.dumps(saved if self.specials is None else {**saved, "specials": self.specials.to_dict()})

    def hf_json(self) -> str:
        return self._tok.to_str()


def from_json(text: str) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`to_json` output."""
    data = json.loads(text) if isinstance(text, str) else None
    if not isinstance(data, dict):
        raise DataError("a tokenizer is a JSON object")
    if (
        data.get("type") == "char"
        and isinstance(data.get("chars"), str)
        and len(set(data["chars"])) == len(data["chars"])
    ):
        return CharTokenizer(data["chars"])
    if data.get("type") == "bpe" and isinstance(data.get("tokenizer"), str):
        return BPETokenizer.from_json(data["tokenizer"])
    if data.get("type") == "hf":
        tok = HFTokenizer.from_str(data["tokenizer"], where="the stored tokenizer")
        if data.get("specials") is not None:  # (runs imported before the ids travelled with it have none)
            try:
                tok.specials = SpecialIds.from_dict(data["specials"], vocab_size=tok.vocab_size)
            except ValueError as exc:
                raise DataError(f"damaged tokenizer: {exc}") from None
        return tok
    if data.get("type") in ("pretrained", "sentencepiece"):
        return (PretrainedTokenizer if data["type"] == "pretrained" else SentencePieceTokenizer).from_saved(data)
    raise DataError(f"unknown or damaged tokenizer (type {str(data.get('type'))[:40]!r})")


def train(kind: str, texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a tokenizer of ``kind`` ('bpe', 'char' or 'sentencepiece') on ``texts``."""
    if kind == "char":
        return CharTokenizer.train(texts, vocab_size)
    if kind == "sentencepiece":
        return SentencePieceTokenizer.train(texts, vocab_size)
    return BPETokenizer.train(texts, vocab_size)


def specials(tokenizer: Tokenizer) -> SpecialIds:
    """The ids with a role in ``tokenizer``: its own (a given tokenizer), else tfbuilder's 0-4."""

    own = getattr(tokenizer, "specials", None)
    return OWN if own is None else own


def unknown(tokenizer: Tokenizer, text: str) -> list[str]:
    """What of ``text`` ``tokenizer`` can only read as <unk> (nothing for byte-level BPE, which has
    every byte)."""
    find = getattr(tokenizer, "unknown", None)
    return find(text) if find is not None else []
