"""The prepared store: a corpus tokenized once, written to disk, read by every run that uses it.

Layout of one store, ``<root>/<key>/``::
    meta.json              what it holds (counts, tokens, dtype) and the key material it was made from
    tokenizer.json         the vocabulary (tfbuilder's own JSON, as in a run directory)
    <split>.<side>.tok     every token id of the split's side, back to back (uint16 or uint32)
    <split>.<side>.idx     int64 offsets: example i is tok[idx[i]:idx[i + 1]]
    <split>.<side>.len     uint32 lengths (what bucketing reads)
    <split>.<side>.txt     validation and test text of translation data (for BLEU), one line per example

``side`` is ``src`` or ``tgt`` (language models have ``src`` only). The ``key`` is a hash of
everything that decides the content (:func:`key_material`): the data files' identity (resolved path,
size, modification time), the data settings that change tokens, and the tokenizer (trained, the one
a resumed run already uses, or the content of a given tokenizer file), so a changed file or setting
prepares again and an unchanged one never does. A store is written into a hidden temporary folder
and renamed into place when complete; an exclusive lock on ``<root>/<key>.lock`` makes concurrent
preparers (sweeps, DDP ranks, several jobs) wait for the one that prepares, so nothing is prepared
twice or read half-written.

The same layout as fairseq's binarized indexed datasets and Megatron's ``.bin``/``.idx`` pairs, with
the cache keyed by content as Hugging Face ``datasets`` fingerprints its caches; examples are read
with positioned reads rather than a memory map (see :mod:`tfbuilder.data.tokens`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfbuilder.data.pretrained import read_bytes
from tfbuilder.data.readers import SplitSource
from tfbuilder.data.tokens import Split, StoredTokens
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection

STORE_VERSION = 1
CACHE_ENV = "TFBUILDER_CACHE"
# The data settings that decide what a store holds. Every other field of the data section decides only
# how it is read (batching, workers, blocks) or is not used for files (synthetic data); a test holds
# that each field is in exactly one of the two lists.
CONTENT_FIELDS = (
    "type",
    "src_lang",
    "tgt_lang",
    "lang",
    "splits",
    "format",
    "columns",
    "hub",
    "max_len",
    "documents",
    "packing",
    "tokenizer",
)
# Content fields added since the first stores: in the key only when set, so that older stores keep their key.
LATER_FIELDS = ("hub",)
READING_FIELDS = (
    "task",
    "symbols",
    "lengths",
    "train_size",
    "val_size",
    "test_size",
    "seed",
    "path",
    "mlm_probability",
    "max_tokens",
    "batch_size",
    "workers",
    "block_size",
    "document_mask",
    "cache",
)


def key_material(data: DataSection, sources: dict[str, SplitSource], tokenizer: str) -> dict:
    """What decides a store's content. ``tokenizer`` is ``"train"`` (trained on the training split)
    or the hash of a given vocabulary. ``data.path`` is left out: the files' resolved paths say it,
    however the recipe spells it."""
    dumped = data.model_dump(mode="json")
    content = {name: dumped[name] for name in CONTENT_FIELDS if name not in LATER_FIELDS or dumped[name] is not None}
    if data.packing:
        content["max_len"] = None  # nothing is dropped
    files = {name: [_identity(path) for path in source.files] for name, source in sources.items()}
    material = {"version": STORE_VERSION, "data": content, "files": files, "tokenizer": tokenizer}
    fingerprints = {name: source.fingerprint for name, source in sources.items() if source.fingerprint is not None}
    if fingerprints:  # Hugging Face datasets: their own content hash, beside the Arrow files
        material["fingerprints"] = fingerprints
    if data.tokenizer.path is not None:  # a given tokenizer: its content, wherever it lies
        try:
            material["tokenizer_file"] = hashlib.sha256(read_bytes(data.tokenizer.path)).hexdigest()
        except DataError:  # gone since: a checkpoint's vocabulary still opens its store; training says why
            material["tokenizer_file"] = None
    return material


def _identity(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def key_of(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:20]


def vocab_hash(vocab_json: str) -> str:
    return "vocab-" + hashlib.sha256(vocab_json.encode()).hexdigest()[:20]


def root(data: DataSection) -> Path:
    """Where stores live: ``data.cache``; else ``$TFBUILDER_CACHE``; else ``.tfbuilder/`` beside the
    data; else (a read-only data folder) the user's cache folder."""
    if data.cache:
        return Path(data.cache)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if data.path is not None:
        beside = Path(data.path) / ".tfbuilder"
        try:
            beside.mkdir(exist_ok=True)
            if os.access(beside, os.W_OK):
                return beside
        except OSError:
            pass
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tfbuilder" / "data"


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed); others wait for it."""
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass
class Opened:
    """A store read back: its splits (read from disk on demand), the validation/test text, the vocabulary JSON."""

    path: Path
    meta: dict
    vocab_json: str
    splits: dict[str, Split]
    raw: dict[str, tuple[list[str], list[str] | None]]


def is_complete(path: Path) -> bool:
    return (path / "meta.json").is_file()


def open_store(path: Path) -> Opened:
    """Open a complete store; a :class:`DataError` if it is damaged (a file missing or of the wrong size)."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        vocab_json = (path / "tokenizer.json").read_text(encoding="utf-8")
        dtype = np.dtype(meta["dtype"])
        splits: dict[str, Split] = {}
        raw: dict[str, tuple[list[str], list[str] | None]] = {}
        for name, info in meta["splits"].items():
            sides = [
                _map_side(path, f"{name}.{side}", dtype, info["examples"], info["tokens"][side])
                for side in info["sides"]
            ]
            splits[name] = Split(
                sides[0], sides[1] if len(sides) > 1 else None, info["dropped"], info["dropped_tokens"]
            )
            if info.get("text"):
                texts = [
                    (path / f"{name}.{side}.txt").read_text(encoding="utf-8").split("\n")[:-1] for side in info["sides"]
                ]
                raw[name] = (texts[0], texts[1] if len(texts) > 1 else None)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise DataError(f"the prepared data in {path} is damaged ({type(exc).__name__}: {str(exc)[:120]})") from None
    return Opened(path, meta, vocab_json, splits, raw)


def _map_side(path: Path, stem: str, dtype: np.dtype, examples: int, tokens: int) -> StoredTokens:
    expected = {".tok": tokens * dtype.itemsize, ".idx": (examples + 1) * 8, ".len": examples * 4}
    for suffix, size in expected.items():
        got = (path / f"{stem}{suffix}").stat().st_size
        if got != size:
            raise ValueError(f"{stem}{suffix} has {got:,} bytes, not {size:,}")
    return StoredTokens(path / stem, dtype, examples)


class SideWriter:
    """Appends encoded rows of one split's side to its ``.tok``/``.len`` files; ``.idx`` at the end."""

    def __init__(self, directory: Path, stem: str, dtype: np.dtype):
        self.directory, self.stem, self.dtype = directory, stem, dtype
        self.tok = open(directory / f"{stem}.tok", "wb")
        self.len = open(directory / f"{stem}.len", "wb")
        self.examples = self.tokens = 0

    def add(self, rows: list[list[int]]) -> None:
        lengths = np.fromiter(map(len, rows), dtype=np.uint32, count=len(rows))
        count = int(lengths.sum(dtype=np.int64))
        flat = np.fromiter((t for row in rows for t in row), dtype=self.dtype, count=count)
        self.tok.write(flat.tobytes())
        self.len.write(lengths.tobytes())
        self.examples += len(rows)
        self.tokens += count

    def close(self) -> None:
        self.tok.close()
        self.len.close()
        lengths = np.fromfile(self.directory / f"{self.stem}.len", dtype=np.uint32)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        offsets.tofile(self.directory / f"{self.stem}.idx")


TEMP_MARK = ".tmp-"  # a store being written: ".<key>.tmp-<pid>", hidden, never opened


def temp_dir(root_dir: Path, key: str) -> Path:
    return root_dir / f".{key}{TEMP_MARK}{os.getpid()}"


def publish(tmp: Path, final: Path, meta: dict) -> None:
    """Write ``meta.json`` last, then rename the finished folder into place (atomic)."""
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    for child in tmp.iterdir():  # durable before it becomes visible
        with open(child, "rb") as f:
            os.fsync(f.fileno())
    if final.exists():  # damaged (checked by the caller, under the lock): replaced
        shutil.rmtree(final)
    os.rename(tmp, final)


def clear_temporaries(root_dir: Path, key: str) -> None:
    """Remove what a killed preparer of ``key`` left (the caller holds the key's lock)."""
    for leftover in root_dir.glob(f".{key}{TEMP_MARK}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def closest(root_dir: Path, material: dict) -> str | None:
    """Why no store matched: what differs from the newest store made from the same files' paths (a
    file changed, a setting changed), or None when there is none to compare with."""
    ours = {p[0] for files in material["files"].values() for p in files}
    best: tuple[float, dict] | None = None
    for meta_path in root_dir.glob("*/meta.json"):
        try:
            other = json.loads(meta_path.read_text(encoding="utf-8"))["key_material"]
            theirs = {p[0] for files in other["files"].values() for p in files}
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if theirs == ours and (best is None or meta_path.stat().st_mtime > best[0]):
            best = (meta_path.stat().st_mtime, other)
    if best is None:
        return None
    other = best[1]
    theirs_all = [q for f in other["files"].values() for q in f]
    names = [Path(p[0]).name for files in material["files"].values() for p in files]

    def shown(path: str) -> str:  # the file's name, with its folder where names repeat (a dataset's splits)
        return Path(path).name if names.count(Path(path).name) == 1 else f"{Path(path).parent.name}/{Path(path).name}"

    changes = [f"{shown(p[0])} changed" for files in material["files"].values() for p in files if p not in theirs_all]
    changes += [f"data.{k} changed" for k, v in material["data"].items() if other["data"].get(k) != v]
    if material.get("fingerprints") != other.get("fingerprints") and not changes:
        changes.append("the dataset's fingerprint changed")
    if material["tokenizer"] != other["tokenizer"]:
        changes.append("another vocabulary")
    if material.get("tokenizer_file") != other.get("tokenizer_file"):
        changes.append("the tokenizer file changed")
    return ", ".join(dict.fromkeys(changes)) or None


def elapsed(start: float) -> str:
    return f"{time.perf_counter() - start:.1f} s"
