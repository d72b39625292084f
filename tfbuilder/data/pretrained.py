"""Tokenizers people already have: a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library) and
SentencePiece models (Kudo & Richardson 2018, arXiv:1808.06226), given as files or trained here.

A given tokenizer keeps its own ids: its special tokens are found by name (``<pad>``, ``[PAD]``,
``<s>``, ``[CLS]``, ...) or named in ``data.tokenizer.specials``, and travel as
:class:`~tfbuilder.specials.SpecialIds` to batching, the objectives, the model and its checkpoint.
A SentencePiece model trained here puts its specials at tfbuilder's ids 0-4.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from tfbuilder.errors import DataError
from tfbuilder.spec.ports import Facts
from tfbuilder.specials import CANDIDATES, COUNT, NEEDED, OWN, ROLES, SPECIAL_TOKENS, SpecialIds, lacking  # noqa: F401 (roles re-exported)

MAX_TOKENIZER_BYTES = 256 << 20


def find_specials(lookup, named: dict[str, str | None] | None = None) -> dict[str, int | None]:
    """Each role's id: the token ``named`` gives it (an error if the tokenizer lacks it), else the first
    of its usual names the tokenizer has (``lookup(token) -> id | None``), else None."""
    found: dict[str, int | None] = {}
    for role in ROLES:
        token = (named or {}).get(role)
        if token is not None:
            found[role] = lookup(token)
            if found[role] is None:
                raise DataError(f"data.tokenizer.specials.{role}: the tokenizer has no token {token!r}")
            continue
        found[role] = next((i for i in map(lookup, CANDIDATES[role]) if i is not None), None)
    return found


def special_ids(found: dict[str, int | None]) -> SpecialIds:
    return SpecialIds.of(start=found["bos"], end=found["eos"], pad=found["pad"], unk=found["unk"], mask=found["mask"])


class PretrainedTokenizer:
    """A Hugging Face ``tokenizers`` file used as it is: its ids, its specials (found by name)."""

    kind = "pretrained"

    def __init__(self, tokenizer, specials: SpecialIds):
        self._tok = tokenizer
        self.specials = specials
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def from_file(cls, path: str | Path, named: dict[str, str | None] | None = None) -> PretrainedTokenizer:
        return cls.from_str(read_text(path), named, where=str(path))

    @classmethod
    def from_str(
        cls, text: str, named: dict[str, str | None] | None = None, *, where: str = "the tokenizer"
    ) -> PretrainedTokenizer:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001 (the tokenizers library raises plain Exceptions on bad files)
            raise DataError(
                f"{where}: not a Hugging Face tokenizer.json ({(str(exc).splitlines() or ['?'])[0][:200]})"
            ) from None
        return cls(tok, special_ids(find_specials(tok.token_to_id, named)))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        reserved = set(self.specials.reserved())
        return self._tok.decode([i for i in ids if i not in reserved], skip_special_tokens=True).strip()

    def to_json(self) -> str:
        return json.dumps({"type": "pretrained", "tokenizer": self._tok.to_str(), "specials": self.specials.to_dict()})

    def hf_json(self) -> str:
        """The ``tokenizers`` library's JSON (what ``tokenizer.json`` holds)."""
        return self._tok.to_str()

    @classmethod
    def from_saved(cls, data: dict) -> PretrainedTokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(data["tokenizer"])
        return cls(tok, SpecialIds.from_dict(data["specials"], vocab_size=tok.get_vocab_size()))


class SentencePieceTokenizer:
    """A SentencePiece model (unigram or BPE, Kudo & Richardson 2018): a ``.model`` file, or trained
    here with tfbuilder's specials at ids 0-4."""

    kind = "sentencepiece"

    def __init__(self, model: bytes, named: dict[str, str | None] | None = None):
        import sentencepiece as spm

        self.model = model
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model)
        except Exception as exc:  # noqa: BLE001 (sentencepiece raises RuntimeError or OSError on bad files)
            raise DataError(f"not a SentencePiece model ({(str(exc).splitlines() or ['?'])[0][:200]})") from None
        self.vocab_size = self._sp.get_piece_size()

        def lookup(token: str) -> int | None:
            i = self._sp.piece_to_id(token)
            # piece_to_id answers the unknown id for a piece it lacks
            return i if 0 <= i < self.vocab_size and self._sp.id_to_piece(i) == token else None

        found = find_specials(lookup, named)
        # SentencePiece's own ids, where it has them (its unknown token is always there).
        for role, value in (
            ("pad", self._sp.pad_id()),
            ("bos", self._sp.bos_id()),
            ("eos", self._sp.eos_id()),
            ("unk", self._sp.unk_id()),
        ):
            if not (named or {}).get(role) and value >= 0:
                found[role] = value
        self.found = found
        self.specials = special_ids(found)

    @classmethod
    def from_file(cls, path: str | Path, named: dict[str, str | None] | None = None) -> SentencePieceTokenizer:
        try:
            return cls(read_bytes(path), named)
        except DataError as exc:
            raise DataError(f"{path}: {exc}") from None

    @classmethod
    def train(cls, texts: Sequence[str], vocab_size: int) -> SentencePieceTokenizer:
        """A unigram model of ``vocab_size`` pieces with <pad> <s> </s> <unk> <mask> at ids 0-4."""
        import io

        import sentencepiece as spm

        out = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter([t for t in texts if t.strip()]),
                model_writer=out,
                vocab_size=vocab_size,
                pad_id=0,
                bos_id=1,
                eos_id=2,
                unk_id=3,
                pad_piece=SPECIAL_TOKENS[0],
                bos_piece=SPECIAL_TOKENS[1],
                eos_piece=SPECIAL_TOKENS[2],
                unk_piece=SPECIAL_TOKENS[3],
                user_defined_symbols=[SPECIAL_TOKENS[4]],
                character_coverage=1.0,
                hard_vocab_limit=True,
                minloglevel=2,
                num_threads=1,
            )
        except RuntimeError as exc:
            text = (str(exc).splitlines() or ["?"])[0]
            raise DataError(
                f"SentencePiece could not train a {vocab_size}-piece vocabulary on the training text "
                f"({text[:200]}); lower data.tokenizer.vocab_size or add text"
            ) from None
        tok = cls(out.getvalue())
        if tok.specials != OWN or tok.vocab_size != vocab_size:  # what the trainer was told
            raise DataError(
                f"SentencePiece made {tok.vocab_size} pieces with specials {tok.specials}, "
                f"not {vocab_size} with tfbuilder's at ids 0-4"
            )
        return tok

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        reserved = set(self.specials.reserved())
        return self._sp.decode([i for i in ids if i not in reserved]).strip()

    def to_json(self) -> str:
        return json.dumps(
            {
                "type": "sentencepiece",
                "model": base64.b64encode(self.model).decode("ascii"),
                "named": self.named_tokens(),
            }
        )

    def named_tokens(self) -> dict[str, str | None]:
        """Each role's token, as a piece: what rebuilds the same specials."""
        return {role: (self._sp.id_to_piece(i) if i is not None else None) for role, i in self.found.items()}

    @classmethod
    def from_saved(cls, data: dict) -> SentencePieceTokenizer:
        return cls(base64.b64decode(data["model"]), data.get("named"))


def read_bytes(path: str | Path) -> bytes:
    path = Path(path)
    try:
        st = path.stat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):  # a FIFO would block, a device never end
            raise DataError(f"data.tokenizer.path: {path} is not a regular file (a FIFO, socket or device)")
        if st.st_size > MAX_TOKENIZER_BYTES:
            raise DataError(f"{path} is larger than {MAX_TOKENIZER_BYTES:,} bytes: not reading it")
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"data.tokenizer.path: no such file: {path}") from None
    except IsADirectoryError:
        raise DataError(f"data.tokenizer.path: {path} is a folder; give the tokenizer file in it") from None
    except OSError as exc:
        raise DataError(f"data.tokenizer.path: cannot read {path}: {exc.strerror or exc}") from None


def read_text(path: str | Path) -> str:
    try:
        return read_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a Hugging Face tokenizer.json (not UTF-8 text)") from None


def load(kind: str, path: str | Path, named: dict[str, str | None] | None = None):
    """The tokenizer in the file ``path`` (``kind`` pretrained or sentencepiece)."""
    return (
        PretrainedTokenizer.from_file(path, named)
        if kind == "pretrained"
        else SentencePieceTokenizer.from_file(path, named)
    )


_facts: dict[tuple, Facts] = {}


def facts(kind: str, path: str | Path, named: dict[str, str | None] | None = None) -> Facts | None:
    """The vocabulary size and specials of a tokenizer file, or None when it cannot be read (the
    data preparation reports why). Cached by the file's identity: validating reads each file once."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    key = (kind, str(Path(path).resolve()), st.st_size, st.st_mtime_ns, tuple(sorted((named or {}).items())))
    if key not in _facts:
        try:
            tok = load(kind, path, named)
        except (DataError, ImportError):
            return None
        found = (
            tok.found
            if isinstance(tok, SentencePieceTokenizer)
            else {
                "pad": tok.specials.pad,
                "bos": tok.specials.start,
                "eos": tok.specials.end,
                "unk": tok.specials.unk,
                "mask": tok.specials.mask,
            }
        )
        _facts[key] = Facts(tok.vocab_size, found)
    return _facts[key]


def exists(path: str | Path) -> bool:
    """Whether anything is at ``path`` (a stat; nothing is read): the schema's tokenizer-path fallback."""
    return os.path.lexists(path)


def unreadable(kind: str, path: str | Path, named: dict[str, str | None] | None = None) -> str:
    """Why the tokenizer file ``path`` cannot be used (for a recipe problem)."""
    try:
        load(kind, path, named)
    except DataError as exc:
        return str(exc).removeprefix("data.tokenizer.path: ")
    except ImportError:
        return f"reading a {kind} tokenizer needs the {kind} package: pip install 'tfbuilder[{kind}]'"
    return f"cannot read {path} as a {kind} tokenizer"


def char_hf_json(chars: str) -> str:
    """A ``tokenizers`` file that reads text as a :class:`~tfbuilder.data.tokenizers.CharTokenizer`
    with ``chars`` does: one id per character, the specials first, <unk> for the rest."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({c: i + COUNT for i, c in enumerate(chars)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIAL_TOKENS[3]))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.decoder = decoders.Fuse()
    return tok.to_str()
