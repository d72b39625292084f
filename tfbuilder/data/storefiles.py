"""Reading a prepared store's own files without trusting them: each is opened without following a link
and without blocking (a FIFO would block, a device never end), refused unless it is a regular file,
read only up to a bound, and checked against what ``meta.json`` records (sizes, checksums) and against
itself (offsets that start at 0, never decrease and end at the token count; lengths that agree with
them; token ids below the vocabulary size), a chunk at a time, so memory stays bounded whatever the
files hold.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np

from tfbuilder.errors import DataError
from tfbuilder.streams import file_kind

MAX_META_BYTES = 16 << 20  # a store's meta.json: a few KB of counts and key material
MAX_TOKENIZER_BYTES = 256 << 20  # a store's tokenizer.json: as a given tokenizer file (data.tokenizer.path)
MAX_TEXT_BYTES = 1 << 30  # a store's validation/test text or labels (what BLEU reads), when meta.json records no size
CHUNK_BYTES = 8 << 20  # how much of a token, offset or length file is read at once
DIGEST = "blake2b"


class Damaged(DataError):
    """A prepared store whose files cannot be trusted; ``what`` names the file and what is wrong."""

    def __init__(self, store: Path, what: str):
        super().__init__(f"the prepared data in {store} is damaged ({what})")
        self.store, self.what = store, what


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, a regular file of its own: never a link followed, never a
    FIFO waited on. An :class:`OSError` naming what it is otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        what = file_kind(path)
        if what is not None:
            raise OSError(exc.errno, f"is {what}, not a file", str(path)) from None
        raise OSError(exc.errno, "is missing" if exc.errno == errno.ENOENT else exc.strerror, str(path)) from None
    what = file_kind(path, os.fstat(fd))
    if what is not None:
        os.close(fd)
        raise OSError(errno.EINVAL, f"is {what}, not a file", str(path))
    return fd


def read_bounded(path: Path, limit: int) -> bytes:
    """The whole of ``path`` (a regular file, :func:`open_regular`), refused when larger than ``limit``."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"has {size:,} bytes, more than the {limit:,} tfbuilder reads of it", str(path))
        parts: list[bytes] = []
        got = 0
        while part := os.read(fd, min(CHUNK_BYTES, limit + 1 - got)):
            parts.append(part)
            got += len(part)
            if got > limit:  # grew while read
                raise OSError(errno.EFBIG, f"has more than the {limit:,} bytes tfbuilder reads of it", str(path))
        return b"".join(parts)
    finally:
        os.close(fd)


def digest(path: Path) -> str:
    """The checksum of ``path`` that ``meta.json`` records, read a chunk at a time."""
    fd = open_regular(path)
    try:
        hasher = hashlib.blake2b(digest_size=20)
        while part := os.read(fd, CHUNK_BYTES):
            hasher.update(part)
        return hasher.hexdigest()
    finally:
        os.close(fd)


def digest_of(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def check_side(stem: Path, dtype: np.dtype, examples: int, tokens: int, sums: dict[str, list] | None) -> int:
    """Check one side of a stored split, ``<stem>.tok``/``.idx``/``.len``, reading each file once in
    chunks: its size; its checksum when ``sums`` (from ``meta.json``) has one; the offsets start at 0,
    never decrease and end at ``tokens``; every length is its offsets' difference. Returns the largest
    token id (-1 without tokens), for the caller to hold against the vocabulary. An :class:`OSError`
    or :class:`ValueError` naming the file says what is wrong."""
    expected = {".tok": tokens * dtype.itemsize, ".idx": (examples + 1) * 8, ".len": examples * 4}
    fds: dict[str, int] = {}
    try:
        for suffix, size in expected.items():
            name = f"{stem.name}{suffix}"
            try:
                fds[suffix] = open_regular(Path(f"{stem}{suffix}"))
            except OSError as exc:
                raise ValueError(f"{name} {exc.strerror}") from None
            got = os.fstat(fds[suffix]).st_size
            if got != size:
                raise ValueError(f"{name} has {got:,} bytes, not {size:,}")
        hashers = {suffix: hashlib.blake2b(digest_size=20) for suffix in expected}
        # offsets and lengths, together, a chunk of examples at a time
        step = CHUNK_BYTES // 8
        previous = 0
        for first in range(0, examples + 1, step):
            count = min(step, examples + 1 - first)
            raw = _read_at(fds[".idx"], first * 8, count * 8, f"{stem.name}.idx")
            hashers[".idx"].update(raw)
            offsets = np.frombuffer(raw, dtype=np.int64)
            if first == 0 and offsets[0] != 0:
                raise ValueError(f"{stem.name}.idx starts at {int(offsets[0]):,}, not 0")
            steps = np.diff(offsets, prepend=np.int64(previous))
            if (steps < 0).any():
                at = first + int(np.flatnonzero(steps < 0)[0])
                raise ValueError(f"{stem.name}.idx decreases at example {at:,}")
            lengths_count = count - 1 if first == 0 else count  # .len has one entry per example
            raw = _read_at(fds[".len"], max(first - 1, 0) * 4, lengths_count * 4, f"{stem.name}.len")
            hashers[".len"].update(raw)
            lengths = np.frombuffer(raw, dtype=np.uint32)
            if not np.array_equal(lengths, steps[1:] if first == 0 else steps):
                raise ValueError(f"{stem.name}.len disagrees with {stem.name}.idx")
            previous = int(offsets[-1])
        if previous != tokens:
            raise ValueError(f"{stem.name}.idx ends at {previous:,}, not at the {tokens:,} tokens")
        # token ids, a chunk at a time
        largest = -1
        step = CHUNK_BYTES // dtype.itemsize
        for first in range(0, tokens, step):
            count = min(step, tokens - first)
            raw = _read_at(fds[".tok"], first * dtype.itemsize, count * dtype.itemsize, f"{stem.name}.tok")
            hashers[".tok"].update(raw)
            largest = max(largest, int(np.frombuffer(raw, dtype=dtype).max()))
        for suffix, hasher in hashers.items():
            _compare(sums, f"{stem.name}{suffix}", expected[suffix], hasher.hexdigest())
        return largest
    finally:
        for fd in fds.values():
            os.close(fd)


def _read_at(fd: int, start: int, size: int, name: str) -> bytes:
    data = os.pread(fd, size, start)
    if len(data) != size:
        raise ValueError(f"{name} is shorter than it was a moment ago")
    return data


def _compare(sums: dict[str, list] | None, name: str, size: int, got: str) -> None:
    """Hold a file's checksum against the one ``meta.json`` records (stores made before checksums: none)."""
    if sums is None:
        return
    recorded = sums.get(name)
    if recorded is None:
        raise ValueError(f"meta.json records no checksum of {name}")
    if recorded[0] != size or recorded[1] != got:
        raise ValueError(f"{name} is not what was written (its checksum differs)")
