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

import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfbuilder.data import storefiles
from tfbuilder.data.pretrained import read_bytes
from tfbuilder.data.readers import SplitSource
from tfbuilder.data.tokens import Split, StoredTokens
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection
from tfbuilder.streams import file_kind

Damaged = storefiles.Damaged
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


@dataclass
class Opened:
    """A store read back: its splits (read from disk on demand), the validation/test text, the vocabulary JSON."""

    path: Path
    meta: dict
    vocab_json: str
    splits: dict[str, Split]
    raw: dict[str, tuple[list[str], list[str] | None]]
    largest: dict[str, int]  # the largest token id of each side ("train.src"), held against the vocabulary


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a finished store (its ``meta.json``, written last, is there in any form:
    :func:`open_store` says whether it can be used)."""
    meta = path / "meta.json"
    return meta.exists() or meta.is_symlink()


def check_folder(path: Path) -> None:
    """A :class:`DataError` when ``path``, where the store of a key lives, is something tfbuilder did
    not make there (a file, a link, a FIFO): it is neither read nor replaced."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DataError(f"cannot look at the prepared store {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        return
    what = "a file" if stat.S_ISREG(info.st_mode) else file_kind(path, info)
    raise DataError(
        f"{path} is {what}, not a prepared store: tfbuilder makes its stores there itself; "
        "move it away (or set data.cache to another folder), then try again"
    )


SPLIT_NAMES = ("train", "val", "test")
SIDES = ("src", "tgt")


def check_meta(meta: object) -> dict:
    """``meta`` (a parsed ``meta.json``) if it has the shape :func:`open_store` reads; a
    :class:`ValueError` saying what is not."""

    def count(value: object, where: str) -> int:
        if type(value) is not int or value < 0:
            raise ValueError(f"meta.json: {where} is {_shown(value)}, not a count")
        return value

    if not isinstance(meta, dict):
        raise ValueError(f"meta.json holds {_shown(meta)}, not an object")
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise ValueError(f"meta.json: dtype is {_shown(meta.get('dtype'))}, not uint16 or uint32")
    if "vocab_size" in meta:
        count(meta["vocab_size"], "vocab_size")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        raise ValueError(f"meta.json: splits is {_shown(splits)}, not an object with a train split")
    for name, info in splits.items():
        if name not in SPLIT_NAMES:
            raise ValueError(f"meta.json: a split named {_shown(name)}")
        if not isinstance(info, dict):
            raise ValueError(f"meta.json: splits.{name} is {_shown(info)}, not an object")
        for field in ("examples", "rows", "dropped", "dropped_tokens"):
            count(info.get(field), f"splits.{name}.{field}")
        sides, tokens = info.get("sides"), info.get("tokens")
        if not (isinstance(sides, list) and sides in (["src"], ["src", "tgt"])):
            raise ValueError(f"meta.json: splits.{name}.sides is {_shown(sides)}, not [src] or [src, tgt]")
        if not isinstance(tokens, dict):
            raise ValueError(f"meta.json: splits.{name}.tokens is {_shown(tokens)}, not an object")
        for side in sides:
            count(tokens.get(side), f"splits.{name}.tokens.{side}")
        if type(info.get("text", False)) is not bool:
            raise ValueError(f"meta.json: splits.{name}.text is {_shown(info.get('text'))}, not true or false")
    if not isinstance(meta.get("key_material", {}), dict):
        raise ValueError(f"meta.json: key_material is {_shown(meta.get('key_material'))}, not an object")
    sums = meta.get(CHECKSUMS)
    if sums is not None:
        if not isinstance(sums, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and len(v) == 2 and type(v[0]) is int and isinstance(v[1], str)
            for k, v in sums.items()
        ):
            raise ValueError(f"meta.json: {CHECKSUMS} is not an object of [size, checksum] pairs")
    return meta


def _shown(value: object) -> str:
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "text", list: "a list", dict: "an object"}
    return (
        f"{kind.get(type(value), type(value).__name__)} ({json.dumps(value)[:40]})" if value is not None else "missing"
    )


CHECKSUMS = "checksums"  # meta.json: {file name: [bytes, blake2b digest]} of every other file of the store


def _read_store_file(path: Path, limit: int, sums: dict[str, list] | None) -> bytes:
    """A whole file of the store, bounded, and held against its recorded checksum (when there is one)."""
    data = storefiles.read_bounded(path, limit)
    if sums is not None and path.name in sums:
        if [len(data), storefiles.digest_of(data)] != sums[path.name]:
            raise ValueError(f"{path.name} is not what was written (its checksum differs)")
    return data


def open_store(path: Path, splits: Collection[str] | None = None) -> Opened:
    """Open a complete store, checking every file it has (see :mod:`tfbuilder.data.storefiles`);
    ``splits``: the split names it must hold. A :class:`~tfbuilder.data.storefiles.Damaged` error
    naming the file when anything is wrong."""
    check_folder(path)
    try:
        raw_meta = storefiles.read_bounded(path / "meta.json", storefiles.MAX_META_BYTES)
        try:
            meta = check_meta(json.loads(raw_meta.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"meta.json is not JSON ({exc})") from None
        if splits is not None and set(meta["splits"]) != set(splits):
            raise ValueError(f"meta.json holds the splits {sorted(meta['splits'])}, not {sorted(splits)}")
        sums = meta.get(CHECKSUMS)
        vocab_json = _text(
            _read_store_file(path / "tokenizer.json", storefiles.MAX_TOKENIZER_BYTES, sums), "tokenizer.json"
        )
        dtype = np.dtype(meta["dtype"])
        opened: dict[str, Split] = {}
        raw: dict[str, tuple[list[str], list[str] | None]] = {}
        largest: dict[str, int] = {}
        for name, info in meta["splits"].items():
            for side in info["sides"]:
                stem = path / f"{name}.{side}"
                largest[f"{name}.{side}"] = storefiles.check_side(
                    stem, dtype, info["examples"], info["tokens"][side], sums
                )
            sides = [StoredTokens(path / f"{name}.{side}", dtype, info["examples"]) for side in info["sides"]]
            opened[name] = Split(
                sides[0], sides[1] if len(sides) > 1 else None, info["dropped"], info["dropped_tokens"]
            )
            if info.get("text"):
                texts = []
                for side in info["sides"]:
                    data = _read_store_file(path / f"{name}.{side}.txt", storefiles.MAX_TEXT_BYTES, sums)
                    lines = _text(data, f"{name}.{side}.txt").split("\n")[:-1]
                    if len(lines) != info["rows"]:
                        raise ValueError(f"{name}.{side}.txt has {len(lines):,} lines, not {info['rows']:,}")
                    texts.append(lines)
                raw[name] = (texts[0], texts[1] if len(texts) > 1 else None)
        for other in (sums or {}).keys() - _checked(meta):  # labels, and whatever else the store holds
            _read_store_file(path / other, storefiles.MAX_TEXT_BYTES, sums)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = f"{Path(exc.filename).name} {exc.strerror}" if isinstance(exc, OSError) and exc.filename else str(exc)
        raise Damaged(path, what[:200]) from None
    return Opened(path, meta, vocab_json, opened, raw, largest)


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not UTF-8 text") from None


def _checked(meta: dict) -> set[str]:
    """The files :func:`open_store` reads and checks as it opens them."""
    names = {"tokenizer.json"}
    for name, info in meta["splits"].items():
        for side in info["sides"]:
            names |= {f"{name}.{side}{suffix}" for suffix in (".tok", ".idx", ".len")}
            if info.get("text"):
                names.add(f"{name}.{side}.txt")
    return names


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
    """Record every file's size and checksum in ``meta.json``, write it last, then rename the
    finished folder into place (atomic)."""
    meta = {
        **meta,
        CHECKSUMS: {child.name: [child.stat().st_size, storefiles.digest(child)] for child in sorted(tmp.iterdir())},
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    for child in tmp.iterdir():  # durable before it becomes visible
        with open(child, "rb") as f:
            os.fsync(f.fileno())
    if final.exists() or final.is_symlink():  # damaged (checked by the caller, under the lock): replaced
        check_folder(final)
        try:
            shutil.rmtree(final)
        except OSError as exc:
            raise DataError(
                f"cannot replace the damaged prepared data in {final}: {exc.strerror or exc}; remove that folder, "
                "then try again"
            ) from None
    os.rename(tmp, final)


def clear_temporaries(root_dir: Path, key: str) -> None:
    """Remove what a killed preparer of ``key`` left (the caller holds the key's lock)."""
    for leftover in root_dir.glob(f".{key}{TEMP_MARK}*"):
        shutil.rmtree(leftover, ignore_errors=True)


CLOSEST_STORES = 50  # the newest stores (by modification time) that closest() compares with


def closest(root_dir: Path, material: dict) -> str | None:
    """Why no store matched: what differs from the newest store made from the same files' paths (a
    file changed, a setting changed), or None when there is none to compare with. Only the newest
    :data:`CLOSEST_STORES` stores are looked at, and only their ``meta.json`` when it is a plain file of
    at most :data:`~tfbuilder.data.storefiles.MAX_META_BYTES`."""
    ours = {p[0] for files in material["files"].values() for p in files}
    best: tuple[float, dict] | None = None
    folders: list[tuple[float, Path]] = []
    try:
        with os.scandir(root_dir) as entries:
            for entry in entries:
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                    folders.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path)))
    except OSError:
        return None
    for mtime, folder in sorted(folders, key=lambda f: f[0], reverse=True)[:CLOSEST_STORES]:
        try:
            meta = json.loads(storefiles.read_bounded(folder / "meta.json", storefiles.MAX_META_BYTES))
            other = meta["key_material"]
            theirs = {p[0] for files in other["files"].values() for p in files}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
            continue
        if theirs == ours and (best is None or mtime > best[0]):
            best = (mtime, other)
    if best is None:
        return None
    try:
        return _differences(material, best[1])
    except (KeyError, TypeError, AttributeError, IndexError):  # a meta.json of another shape: nothing to say
        return None


def _differences(material: dict, other: dict) -> str | None:
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
