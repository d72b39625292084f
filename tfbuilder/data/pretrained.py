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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tfbuilder.errors import DataError
from tfbuilder.spec.ports import Facts
from tfbuilder.specials import CANDIDATES, COUNT, NEEDED, OWN, ROLES, SPECIAL_TOKENS, SpecialIds, lacking  # noqa: F401 (roles re-exported)

MAX_TOKENIZER_BYTES = 256 << 20
# What a tokenizer.json may ask for, checked on its JSON before the tokenizers library reads it: ids
# below MAX_TOKEN_ID and below the number of tokens the file holds (an id of 10**9 makes the library
# allocate gigabytes); normalizers (and decoders) at most MAX_NORMALIZERS steps, Sequences nested at
# most MAX_NORMALIZER_DEPTH deep, whose Replace and Prepend steps together make a text at most
# MAX_EXPANSION times longer (each multiplies by the length of what it writes, a regular expression's
# Replace by one more: it may match between characters).
MAX_TOKEN_ID = 1 << 24
MAX_NORMALIZERS = 64
MAX_NORMALIZER_DEPTH = 4
MAX_EXPANSION = 256


def check_hf_json(text: str, where: str) -> None:
    """Refuse (naming ``where`` and the key) a ``tokenizer.json`` whose ids or normalizers would take
    unbounded memory; JSON that is not a tokenizer is left for the tokenizers library to refuse."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise DataError(f"{where}: not a Hugging Face tokenizer.json (nested too deeply)") from None
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    _check_ids(data, where)
    for key in ("normalizer", "decoder"):
        steps = [0]
        factor = _expansion(data.get(key), key, 0, steps, where)
        if factor > MAX_EXPANSION:
            raise DataError(
                f"{where}: {key}: its Replace and Prepend steps make a text up to {factor:,} times longer "
                f"(at most {MAX_EXPANSION} allowed)"
            )


def _check_ids(data: dict, where: str) -> None:
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    added = data.get("added_tokens")
    added = added if isinstance(added, list) else []
    held = (len(vocab) if isinstance(vocab, (dict, list)) else 0) + len(added)
    bound = min(MAX_TOKEN_ID, held)
    ids: list[tuple[str, Any]] = []
    if isinstance(vocab, dict):  # WordLevel, WordPiece, BPE: token -> id (a Unigram's ids are its list's order)
        ids += [(f"model.vocab[{token!r}]", i) for token, i in vocab.items()]
    ids += [(f"added_tokens[{n}].id", t.get("id")) for n, t in enumerate(added) if isinstance(t, dict)]
    for key, i in ids:
        if isinstance(i, int) and not isinstance(i, bool) and not 0 <= i < bound:
            raise DataError(
                f"{where}: {key}: id {i} is out of range: the file holds {held:,} tokens, "
                f"so ids must be below {bound:,}"
            )


def _expansion(node: Any, key: str, depth: int, steps: list[int], where: str) -> int:
    """How many times longer the normalizer (or decoder) ``node`` may make a text, at most (a bound)."""
    if not isinstance(node, dict):
        return 1
    if node.get("type") == "Sequence":
        if depth >= MAX_NORMALIZER_DEPTH:
            raise DataError(f"{where}: {key}: Sequences nested more than {MAX_NORMALIZER_DEPTH} deep")
        inner = "normalizers" if "normalizers" in node else "decoders"
        parts = node.get(inner)
        factor = 1
        for n, part in enumerate(parts if isinstance(parts, list) else []):
            factor *= _expansion(part, f"{key}.{inner}[{n}]", depth + 1, steps, where)
            if factor > MAX_EXPANSION:
                raise DataError(
                    f"{where}: {key}: its Replace and Prepend steps make a text up to {factor:,} times longer "
                    f"(at most {MAX_EXPANSION} allowed)"
                )
        return factor
    steps[0] += 1
    if steps[0] > MAX_NORMALIZERS:
        raise DataError(f"{where}: {key}: more than {MAX_NORMALIZERS} steps")
    written = node.get("content") if node.get("type") == "Replace" else node.get("prepend")
    if node.get("type") not in ("Replace", "Prepend") or not isinstance(written, str):
        return 1
    pattern = node.get("pattern")
    factor = len(written) + (1 if isinstance(pattern, dict) and "Regex" in pattern else 0)
    if factor > MAX_EXPANSION:
        field = "content" if node.get("type") == "Replace" else "prepend"
        raise DataError(
            f"{where}: {key}.{field}: {node['type']} writes {len(written):,} characters "
            f"(a text may grow at most {MAX_EXPANSION} times)"
        )
    return max(1, factor)


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic inside the tokenizers library (``pyo3_runtime.PanicException``,
    a BaseException, not an Exception)."""
    return type(exc).__name__ == "PanicException"


@contextmanager
def tokenizer_failures(where: str, doing: str, *, errors: bool = False) -> Iterator[None]:
    """A Rust panic inside the tokenizers library (a regular expression that backtracks without end
    panics when it reaches Oniguruma's retry limit) becomes a DataError naming the file ``where``;
    with ``errors``, so does any exception it raises (reading a file: it raises plain Exceptions)."""
    try:
        yield
    except DataError:
        raise
    except Exception as exc:
        if not errors:
            raise
        raise DataError(f"{where}: {doing} ({_first_line(exc)})") from None
    except BaseException as exc:
        if not is_panic(exc):
            raise  # KeyboardInterrupt, SystemExit
        raise DataError(f"{where}: {doing}: the tokenizers library failed ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or ["?"])[0][:200]


def hf_tokenizer(text: str, where: str):
    """A ``tokenizers.Tokenizer`` from the JSON ``text`` (of the file ``where``), checked first."""
    from tokenizers import Tokenizer

    check_hf_json(text, where)
    with tokenizer_failures(where, "not a Hugging Face tokenizer.json", errors=True):
        return Tokenizer.from_str(text)


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

    def __init__(self, tokenizer, specials: SpecialIds, where: str = "the tokenizer"):
        self._tok = tokenizer
        self.specials = specials
        self.vocab_size = tokenizer.get_vocab_size()
        self.where = where  # the file, named when the tokenizer fails on a text

    @classmethod
    def from_file(cls, path: str | Path, named: dict[str, str | None] | None = None) -> PretrainedTokenizer:
        return cls.from_str(read_text(path), named, where=str(path))

    @classmethod
    def from_str(
        cls, text: str, named: dict[str, str | None] | None = None, *, where: str = "the tokenizer"
    ) -> PretrainedTokenizer:
        tok = hf_tokenizer(text, where)
        return cls(tok, special_ids(find_specials(tok.token_to_id, named)), where)

    def encode(self, text: str) -> list[int]:
        with tokenizer_failures(self.where, "cannot encode the text"):
            return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        with tokenizer_failures(self.where, "cannot encode the text"):
            return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        reserved = set(self.specials.reserved())
        with tokenizer_failures(self.where, "cannot decode the ids"):
            return self._tok.decode([i for i in ids if i not in reserved], skip_special_tokens=True).strip()

    def to_json(self) -> str:
        return json.dumps({"type": "pretrained", "tokenizer": self._tok.to_str(), "specials": self.specials.to_dict()})

    def hf_json(self) -> str:
        """The ``tokenizers`` library's JSON (what ``tokenizer.json`` holds)."""
        return self._tok.to_str()

    @classmethod
    def from_saved(cls, data: dict) -> PretrainedTokenizer:
        where = "the stored tokenizer"
        tok = hf_tokenizer(data["tokenizer"], where)
        return cls(tok, SpecialIds.from_dict(data["specials"], vocab_size=tok.get_vocab_size()), where)


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
