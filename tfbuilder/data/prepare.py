"""Turn a recipe's data section into tokenized splits, checking everything before training starts.

Text data is prepared once into a store on disk (:mod:`tfbuilder.data.store`) and read from it
afterwards; generated (synthetic) data is made in memory, in the same flat layout, at every start.
Reading, tokenizer training and encoding stream in chunks, so preparing costs bounded memory.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

import numpy as np

from tfbuilder.data import labels as label_files
from tfbuilder.data import pretrained, store, storelock, synthetic
from tfbuilder.data import tokenizers as toks
from tfbuilder.data.location import locate
from tfbuilder.data.readers import Row, SplitSource, chunks, label_of, split_sources
from tfbuilder.data.tokenizers import Tokenizer
from tfbuilder.data.tokens import Rows, Split, TokenArray, token_dtype
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection
from tfbuilder.specials import LANGUAGE_MODEL_ADDED, TRANSLATION_ADDED, SpecialIds

log = logging.getLogger("tfbuilder")


@dataclass
class Vocab:
    """The tokenizers of a run: one shared (the paper) or one per side."""

    src: Tokenizer
    tgt: Tokenizer

    @property
    def shared(self) -> bool:
        return self.src is self.tgt

    @property
    def specials(self) -> SpecialIds:
        """The ids batches are made with (<s>, </s>, padding), and the model decodes with: the target
        tokenizer's (a given tokenizer's own, else tfbuilder's 0-4)."""
        return toks.specials(self.tgt)

    def to_json(self) -> str:
        if self.shared:
            return json.dumps({"shared": self.tgt.to_json()})
        return json.dumps({"src": self.src.to_json(), "tgt": self.tgt.to_json()})

    @classmethod
    def from_json(cls, text: str) -> Vocab:
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
class Prepared:
    """Every split of a recipe's data, tokenized; ``raw`` keeps the text of translation data's
    validation and test splits (for BLEU); ``store`` is where it lives on disk (None: in memory)."""

    vocab: Vocab
    splits: dict[str, Split] = field(default_factory=dict)
    raw: dict[str, tuple[list[str], list[str] | None]] = field(default_factory=dict)
    store: Path | None = None


CHUNK = 8192  # rows encoded at once: bounded memory, and large enough for the tokenizer's parallel batches


def prepare(
    data: DataSection,
    *,
    vocab: Vocab | None = None,
    model_vocab: int | None = None,
    say: Callable[[str], None] | None = None,
) -> Prepared:
    """Read, check and tokenize all splits, or open the store a previous call prepared; train the
    vocabulary unless one is given (resume, other ranks, scoring). ``say`` hears one line on what
    happened (prepared, and why; or reused); by default the ``tfbuilder`` logger does."""
    say = say or log.info
    locate(data)
    sources = split_sources(data, say=say)
    prepared = _generated(data, sources, vocab) if data.type == "synthetic" else _stored(data, sources, vocab, say)
    if model_vocab is not None and prepared.vocab.tgt.vocab_size != model_vocab:
        raise DataError(f"the tokenizer has {prepared.vocab.tgt.vocab_size} tokens but the model expects {model_vocab}")
    train = prepared.splits["train"]
    if train.dropped:
        say(
            f"data: {train.dropped:,} training examples ({train.dropped_tokens:,} tokens) left out: empty, "
            f"or longer than data.max_len={data.max_len}"
        )
    for name, split in prepared.splits.items():
        if len(split) == 0:
            raise DataError(f"the {name} split has no usable examples")
    budget = data.max_tokens
    if budget is not None and not data.packing:
        longest = max(positions(s) for s in prepared.splits.values())
        if longest > budget:
            raise DataError(
                f"data.max_tokens ({budget}) is smaller than the longest example "
                f"({longest} tokens with its special tokens)"
            )
    return prepared


def _generated(data: DataSection, sources: dict[str, SplitSource], vocab: Vocab | None) -> Prepared:
    """Synthetic data: generated from its seed in a moment, so made in memory at every start."""
    if vocab is None:
        tok = toks.CharTokenizer(synthetic.alphabet(data.symbols))
        vocab = Vocab(tok, tok)
    prepared = Prepared(vocab)
    for name, source in sources.items():
        sides = [_MemorySide() for _ in range(2 if source.paired else 1)]
        texts: list[list[str]] = [[] for _ in sides] if name != "train" else []
        info = _encode(source, vocab, sides, texts, max_len=data.max_len if name == "train" else None)
        arrays = [side.finish() for side in sides]
        prepared.splits[name] = Split(
            arrays[0], arrays[1] if len(arrays) > 1 else None, info["dropped"], info["dropped_tokens"]
        )
        if texts:
            prepared.raw[name] = (texts[0], texts[1] if len(texts) > 1 else None)
    return prepared


def _stored(
    data: DataSection, sources: dict[str, SplitSource], vocab: Vocab | None, say: Callable[[str], None]
) -> Prepared:
    """Open the store whose key matches, or prepare it (one process at a time per key)."""
    root = store.root(data).resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the prepared-data folder {root}: {exc.strerror or exc} (set data.cache)"
        ) from None
    given = vocab.to_json() if vocab is not None else None
    trained = store.key_material(data, sources, "train")
    candidates = [trained] if given is None else [trained, store.key_material(data, sources, store.vocab_hash(given))]
    names = list(sources)
    damaged: dict[Path, str] = {}
    for material in candidates:
        found = _reuse(root / store.key_of(material), given, names, damaged)
        if found is not None:
            say(f"data: using the prepared store {found.store} (files and settings unchanged)")
            return found
    material = candidates[-1]
    key = store.key_of(material)
    path = root / key
    with storelock.locked(root / f"{key}.lock", say):
        damaged.pop(path, None)
        found = _reuse(path, given, names, damaged)  # prepared by another process while this one waited
        if found is not None:
            say(f"data: using the prepared store {found.store} (prepared by another process)")
            return found
        if path in damaged:
            say(f"data: the prepared store {path} is damaged ({damaged[path]}); preparing it again")
            why = f"the store was damaged: {damaged[path]}"
        else:
            why = store.closest(root, material) or "no store for these files yet"
        start = time.perf_counter()
        try:
            store.clear_temporaries(root, key)
            tmp = store.temp_dir(root, key)
            tmp.mkdir()
        except OSError as exc:
            raise _write_failed(exc, root) from None
        try:
            meta = _write(tmp, data, sources, vocab, material)
            store.publish(tmp, path, meta)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_failed(exc, root) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    prepared = _from_store(store.open_store(path, names))
    counts = " / ".join(f"{len(s):,} {n}" for n, s in prepared.splits.items())
    say(f"data: prepared {counts} examples into {path} in {store.elapsed(start)} ({why})")
    return prepared


def _write_failed(exc: OSError, root: Path) -> DataError:
    """What a user reads when the prepared data cannot be written (the disk full, a folder not writable)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DataError(
            f"the disk is full: no space left to write the prepared data into {root} ({exc.strerror or exc}); "
            "free space there, or set data.cache (or $TFBUILDER_CACHE) to a folder on another disk"
        )
    where = f"{exc.filename}: " if exc.filename else ""
    return DataError(
        f"cannot write the prepared data into {root}: {where}{exc.strerror or exc} "
        "(data.cache or $TFBUILDER_CACHE chooses another folder)"
    )


def _reuse(path: Path, given: str | None, names: list[str], damaged: dict[Path, str]) -> Prepared | None:
    """The store at ``path`` if it is complete, intact and (when a vocabulary is given) uses it; what is
    wrong with it goes into ``damaged`` (it is prepared again under the lock, replacing it)."""
    store.check_folder(path)
    if not store.is_complete(path):
        if path.is_dir():
            damaged[path] = "meta.json is missing"
        return None
    try:
        opened = store.open_store(path, names)
        if given is not None and opened.vocab_json != given:
            return None
        return _from_store(opened)
    except store.Damaged as exc:
        damaged[path] = exc.what
        return None


def _from_store(opened: store.Opened) -> Prepared:
    """The prepared data of an opened store; a :class:`~tfbuilder.data.store.Damaged` error when its
    vocabulary cannot be read or a side holds a token id beyond it."""
    try:
        vocab = Vocab.from_json(opened.vocab_json)
    except DataError as exc:
        raise store.Damaged(opened.path, f"tokenizer.json: {exc}") from None
    for name, largest in opened.largest.items():
        size = (vocab.tgt if name.endswith(".tgt") else vocab.src).vocab_size
        if largest >= size:
            raise store.Damaged(
                opened.path, f"{name}.tok holds the token id {largest:,}, beyond the {size:,} of its vocabulary"
            )
    return Prepared(vocab, opened.splits, opened.raw, opened.path)


def _write(tmp: Path, data: DataSection, sources: dict[str, SplitSource], vocab: Vocab | None, material: dict) -> dict:
    """Prepare every split into ``tmp``; the store's ``meta.json`` content."""
    start = time.perf_counter()
    if vocab is None:
        vocab = build_vocab(data, sources["train"])
    trained = time.perf_counter() - start
    vocab_json = vocab.to_json()
    (tmp / "tokenizer.json").write_text(vocab_json, encoding="utf-8")
    dtype = token_dtype(max(vocab.src.vocab_size, vocab.tgt.vocab_size))
    splits = {}
    for name, source in sources.items():
        names = ["src", "tgt"] if source.paired else ["src"]
        sides = [store.SideWriter(tmp, f"{name}.{side}", dtype) for side in names]
        keep_text = source.paired and name != "train" and not source.labelled  # for BLEU
        handles = (
            [open(tmp / f"{name}.{side}.txt", "w", encoding="utf-8", newline="\n") for side in names]
            if keep_text
            else []
        )
        labels = label_files.Collected() if source.labelled else None
        try:
            info = _encode(
                source,
                vocab,
                sides,
                handles,
                max_len=data.max_len if name == "train" and not data.packing else None,
                labels=labels,
            )
            if labels is not None:
                label_files.write(tmp, name, source.label or str(source.files[0]), labels)
        finally:
            for side in sides:
                side.close()
            for handle in handles:
                handle.close()
        splits[name] = {
            **info,
            "sides": names,
            "text": keep_text,
            "tokens": {n: s.tokens for n, s in zip(names, sides, strict=True)},
        }
    return {
        "version": store.STORE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": round(time.perf_counter() - start, 2),
        "seconds_tokenizer": round(trained, 2),
        "dtype": dtype.name,
        "vocab_size": vocab.tgt.vocab_size,
        "splits": splits,
        "key_material": material,
    }


class _Side(Protocol):
    """Where encoded rows of one side go: a file (:class:`~tfbuilder.data.store.SideWriter`) or memory."""

    def add(self, rows: list[list[int]]) -> None: ...


class _MemorySide:
    def __init__(self) -> None:
        self.rows: list[list[int]] = []

    def add(self, rows: list[list[int]]) -> None:
        self.rows.extend(rows)

    def finish(self) -> TokenArray:
        return TokenArray.from_rows(self.rows)


def _encode(
    source: SplitSource,
    vocab: Vocab,
    sides: Sequence[_Side],
    texts: Sequence[list[str] | TextIO],
    *,
    max_len: int | None,
    labels: label_files.Collected | None = None,
) -> dict:
    """Stream ``source`` through the tokenizer into ``sides`` (one per side), chunk by chunk, keeping
    the text in ``texts`` (lists or files) when given, and the labels of the examples kept in
    ``labels`` (labelled data). Empty examples are left out, and with ``max_len`` longer ones;
    returns the counts."""
    rows = seen = dropped = dropped_tokens = 0
    nonblank = [0, 0]
    for chunk in chunks(source.rows(), CHUNK):
        columns = [[row[0] for row in chunk]] + ([[row[1] or "" for row in chunk]] if source.paired else [])
        for i, lines in enumerate(columns):
            nonblank[i] += sum(1 for line in lines if line.strip())
            if texts:
                sink = texts[i]
                if isinstance(sink, list):
                    sink.extend(lines)
                else:
                    sink.write("".join(line.replace("\n", " ") + "\n" for line in lines))
        encoded = [vocab.src.encode_batch(columns[0])] + ([vocab.tgt.encode_batch(columns[1])] if source.paired else [])
        keep = [
            i
            for i in range(len(chunk))
            if all(ids[i] for ids in encoded) and (max_len is None or all(len(ids[i]) <= max_len for ids in encoded))
        ]
        if len(keep) < len(chunk):
            kept = set(keep)
            dropped += len(chunk) - len(keep)
            dropped_tokens += sum(len(ids[i]) for ids in encoded for i in range(len(chunk)) if i not in kept)
            encoded = [[ids[i] for i in keep] for ids in encoded]
        for side, ids in zip(sides, encoded, strict=True):
            side.add(ids)
        if labels is not None:
            labels.add([rows + i + 1 for i in keep], [label_of(chunk[i]) for i in keep])
        rows += len(chunk)
        seen += len(keep)
    for i, count in enumerate(nonblank[: len(sides)]):
        if count == 0:
            if source.label is None:  # text files: one per side
                raise DataError(f"{source.files[i] if i < len(source.files) else f'the {source.name} split'} is empty")
            which = "" if len(sides) == 1 else (" source" if i == 0 else " target")
            raise DataError(f"{source.label} is empty: no{which} text in any row")
    return {"examples": seen, "rows": rows, "dropped": dropped, "dropped_tokens": dropped_tokens}


def sample_rows(rows: Iterable[Row], size: int | None, *, seed: int = 0) -> list[Row]:
    """A uniform sample of ``size`` rows in one pass with bounded memory (reservoir sampling, Vitter's
    algorithm R, drawn a chunk at a time); every row, in order, when there are no more than ``size``."""
    if size is None:
        return list(rows)
    rng = np.random.default_rng(seed)
    kept: list[Row] = []
    seen = 0
    for chunk in chunks(rows, 65536):
        fill = min(len(chunk), max(size - seen, 0))
        kept.extend(chunk[:fill])
        if fill < len(chunk):
            positions = np.arange(seen + fill, seen + len(chunk)) + 1
            slots = rng.integers(0, positions)  # row n replaces a random slot with probability size / n
            for offset in np.flatnonzero(slots < size):
                kept[slots[offset]] = chunk[fill + offset]
        seen += len(chunk)
    return kept


PRETRAINED_WITHOUT_PATH = (
    "data.tokenizer: type pretrained without a path is the tokenizer of the weights a run starts from: "
    "give fit --init-from CHECKPOINT (an imported model's run), or data.tokenizer.path (a tokenizer.json)"
)


def build_vocab(data: DataSection, train: SplitSource) -> Vocab:
    """Train the tokenizer(s) on (a sample of ``data.tokenizer.sample`` examples of) the training split."""
    tok: Tokenizer
    if data.type == "synthetic":
        tok = toks.CharTokenizer(synthetic.alphabet(data.symbols))
        return Vocab(tok, tok)
    if data.tokenizer.path is not None:  # given: a tokenizer people already have, used as it is on both sides
        named = data.tokenizer.specials.model_dump() if data.tokenizer.specials else None
        tok = pretrained.load(data.tokenizer.type, data.tokenizer.path, named)
        return Vocab(tok, tok)
    if data.tokenizer.type == "pretrained":  # without a path: the weights' own, which only --init-from gives
        raise DataError(PRETRAINED_WITHOUT_PATH)
    size = data.tokenizer.vocab_size
    if size is None:  # the schema requires it for a trained tokenizer; a section built without validation gets this
        raise DataError("a tokenizer trained on the data needs data.tokenizer.vocab_size")
    rows = sample_rows(train.rows(), data.tokenizer.sample)
    src = [row[0] for row in rows]
    tgt = [row[1] or "" for row in rows] if train.paired else None
    if tgt is None or data.tokenizer.shared:
        tok = toks.train(data.tokenizer.type, src + (tgt or []), size)
        return Vocab(tok, tok)
    return Vocab(toks.train(data.tokenizer.type, src, size), toks.train(data.tokenizer.type, tgt, size))


def positions(split: Split) -> int:
    """The most positions one example of ``split`` takes in a batch, special tokens included (see
    collate.Collate): x</s>, <s>y and y</s> for translation; <s>x</s> for language models."""
    if split.tgt is None:
        return _longest(split.src) + LANGUAGE_MODEL_ADDED
    return max(_longest(split.src), _longest(split.tgt)) + TRANSLATION_ADDED


def _longest(rows: Rows) -> int:
    return int(rows.lengths.max()) if len(rows) else 0


def summary_lines(prepared: Prepared) -> list[str]:
    """What ``tfbuilder prepare`` prints: where the store is, and each split's examples and tokens."""
    where = (
        f"store: {prepared.store}"
        if prepared.store
        else "generated in memory at every start (synthetic data): nothing is stored"
    )
    lines = [where]
    for name, split in prepared.splits.items():
        sides = [split.src] + ([split.tgt] if split.tgt is not None else [])
        tokens = " + ".join(f"{int(side.lengths.sum(dtype=np.int64)):,}" for side in sides)
        lines.append(
            f"  {name:<6} {len(split):>12,} examples  {tokens} tokens"
            + (f"  ({split.dropped:,} left out)" if split.dropped else "")
        )
    if prepared.store:
        size = sum(f.stat().st_size for f in prepared.store.iterdir())
        lines.append(f"  {size / 2**20:,.1f} MiB on disk")
    return lines
